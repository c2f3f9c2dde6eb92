//! NumPy arrays in and out: dtype dispatch, input normalization (alignment, byte order,
//! bfloat16 tags), typed borrows, and the chunk-wise write-back into callers' arrays.

use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, IxDyn};
use numpy::{
    IntoPyArray, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn,
    PyReadwriteArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rayon::prelude::*;
use tensor_history::{DType, Element, Error, Tensor, WriteStats};

use crate::errors;

/// Run `$body` with `$t` bound to the Rust element type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            tensor_history::DType::F16 => {
                type $t = half::f16;
                $body
            }
            tensor_history::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            tensor_history::DType::F32 => {
                type $t = f32;
                $body
            }
            tensor_history::DType::F64 => {
                type $t = f64;
                $body
            }
            tensor_history::DType::I8 => {
                type $t = i8;
                $body
            }
            tensor_history::DType::I16 => {
                type $t = i16;
                $body
            }
            tensor_history::DType::I32 => {
                type $t = i32;
                $body
            }
            tensor_history::DType::I64 => {
                type $t = i64;
                $body
            }
            tensor_history::DType::U8 => {
                type $t = u8;
                $body
            }
            tensor_history::DType::U16 => {
                type $t = u16;
                $body
            }
            tensor_history::DType::U32 => {
                type $t = u32;
                $body
            }
            tensor_history::DType::U64 => {
                type $t = u64;
                $body
            }
            other => return Err($crate::errors::unsupported_dtype("", &other.to_string())),
        }
    };
}

/// An element type both the core and rust-numpy know, with constructors for the
/// dtype-erased wrappers below.
pub(crate) trait PyElement: Element + numpy::Element + Copy {
    fn read(g: PyReadonlyArrayDyn<'_, Self>) -> ReadGuard<'_>;
    fn write(g: PyReadwriteArrayDyn<'_, Self>) -> WriteGuard<'_>;
    fn owned(a: ArrayD<Self>) -> Owned;
}

macro_rules! dtype_enums {
    ($($v:ident $t:ty),*) => {
        /// A read borrow of a NumPy array of any supported dtype.
        pub(crate) enum ReadGuard<'py> {
            $($v(PyReadonlyArrayDyn<'py, $t>),)*
            /// A zero-size array: not borrowed, since NumPy gives empty arrays zero strides
            /// that ndarray's checks reject.
            Empty(DType, Vec<usize>),
        }
        /// A read-only view of any supported dtype (`Send`: usable without the GIL).
        pub(crate) enum View<'a> { $($v(ArrayViewD<'a, $t>)),* }
        /// A write borrow of a NumPy array of any supported dtype.
        pub(crate) enum WriteGuard<'py> {
            $($v(PyReadwriteArrayDyn<'py, $t>),)*
            /// A zero-size target: there is nothing to write (see `ReadGuard::Empty`).
            Empty(DType, Vec<usize>),
        }
        /// A writable view of any supported dtype (`Send`).
        pub(crate) enum ViewMut<'a> { $($v(ArrayViewMutD<'a, $t>)),* }
        /// An owned array of any supported dtype, on its way to Python.
        pub(crate) enum Owned { $($v(ArrayD<$t>)),* }

        $(impl PyElement for $t {
            fn read(g: PyReadonlyArrayDyn<'_, Self>) -> ReadGuard<'_> { ReadGuard::$v(g) }
            fn write(g: PyReadwriteArrayDyn<'_, Self>) -> WriteGuard<'_> { WriteGuard::$v(g) }
            fn owned(a: ArrayD<Self>) -> Owned { Owned::$v(a) }
        })*

        impl ReadGuard<'_> {
            pub(crate) fn view(&self) -> View<'_> {
                match self {
                    $(ReadGuard::$v(g) => View::$v(g.as_array()),)*
                    ReadGuard::Empty(dt, shape) => match dt {
                        $(DType::$v => View::$v(
                            ArrayViewD::from_shape(IxDyn(shape), &[]).expect("zero-size shape")
                        ),)*
                        _ => unreachable!("only supported dtypes are borrowed"),
                    },
                }
            }
        }
        impl View<'_> {
            /// The view's dtype.
            pub(crate) fn dtype(&self) -> DType {
                match self { $(View::$v(_) => DType::$v),* }
            }
            /// The address of the first element.
            pub(crate) fn addr(&self) -> usize {
                match self { $(View::$v(x) => x.as_ptr() as usize),* }
            }
            /// The view's shape.
            pub(crate) fn shape(&self) -> &[usize] {
                match self { $(View::$v(x) => x.shape()),* }
            }
            /// Whether the view is C-contiguous.
            pub(crate) fn is_standard_layout(&self) -> bool {
                match self { $(View::$v(x) => x.is_standard_layout()),* }
            }
        }
        /// A C-contiguous view of `shape` elements of dtype `dt` at `addr` (`None` for a
        /// dtype with no view).
        ///
        /// # Safety
        ///
        /// `addr` must be the address of a C-contiguous array of that dtype and shape
        /// (aligned, non-null), readable for as long as the view is used.
        #[allow(unsafe_code)] // the one place views are made from addresses: commit_later
        pub(crate) unsafe fn view_from_raw(
            dt: DType,
            addr: usize,
            shape: &[usize],
        ) -> Option<View<'static>> {
            match dt {
                $(DType::$v => Some(View::$v(
                    // SAFETY: as the caller promises.
                    unsafe { ArrayViewD::from_shape_ptr(IxDyn(shape), addr as *const $t) }
                )),)*
                _ => None,
            }
        }
        impl WriteGuard<'_> {
            pub(crate) fn view_mut(&mut self) -> ViewMut<'_> {
                match self {
                    $(WriteGuard::$v(g) => ViewMut::$v(g.as_array_mut()),)*
                    WriteGuard::Empty(dt, shape) => match dt {
                        $(DType::$v => ViewMut::$v(
                            ArrayViewMutD::from_shape(IxDyn(shape), &mut []).expect("zero-size shape")
                        ),)*
                        _ => unreachable!("only supported dtypes are borrowed"),
                    },
                }
            }
        }
        impl Owned {
            pub(crate) fn into_py(self, py: Python<'_>) -> Bound<'_, PyAny> {
                match self { $(Owned::$v(a) => a.into_pyarray(py).into_any()),* }
            }
        }
        /// Run `$body` with `$x` bound to the typed view inside a [`View`].
        macro_rules! on_view {
            ($view:expr, $x:ident => $body:expr) => {
                match $view { $($crate::arrays::View::$v($x) => $body),* }
            };
        }
        pub(crate) use on_view;
        /// Run `$body` with `$x` bound to the typed view inside a [`ViewMut`].
        macro_rules! on_view_mut {
            ($view:expr, $x:ident => $body:expr) => {
                match $view { $($crate::arrays::ViewMut::$v($x) => $body),* }
            };
        }
    };
}

dtype_enums!(F16 f16, BF16 bf16, F32 f32, F64 f64, I8 i8, I16 i16, I32 i32, I64 i64,
    U8 u8, U16 u16, U32 u32, U64 u64);

/// The store dtype of a NumPy array, or `None` if the core has no such dtype.
fn dtype_of(arr: &Bound<'_, PyUntypedArray>) -> PyResult<Option<DType>> {
    let py = arr.py();
    let d = arr.dtype();
    // NumPy has every dtype natively but bfloat16.
    for dt in DType::ALL.into_iter().filter(|&d| d != DType::BF16) {
        let found = with_dtype!(dt, T => d.is_equiv_to(&numpy::dtype::<T>(py)));
        if found {
            return Ok(Some(dt));
        }
    }
    // bfloat16 exists only once ml_dtypes is imported (the package imports it first).
    let ml = py.import("sys")?.getattr("modules")?.get_item("ml_dtypes");
    if ml.is_ok() && d.is_equiv_to(&numpy::dtype::<bf16>(py)) {
        return Ok(Some(DType::BF16));
    }
    Ok(None)
}

fn numpy_mod(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    py.import("numpy")
}

/// Apply an explicit dtype tag: `"bfloat16"` (or `"bf16"`) reinterprets a 2-byte integer
/// array as bfloat16 bit patterns, zero-copy (how torch bf16 tensors arrive, through
/// `t.view(torch.uint16).numpy()`).
fn apply_tag<'py>(arr: Bound<'py, PyAny>, tag: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
    let Some(tag) = tag else { return Ok(arr) };
    let py = arr.py();
    match tag {
        "bfloat16" | "bf16" => {
            let bf = py.import("ml_dtypes")?.getattr("bfloat16")?;
            let np_bf = numpy_mod(py)?.call_method1("dtype", (bf,))?;
            let dt = arr.getattr("dtype")?;
            if dt.eq(&np_bf)? {
                return Ok(arr);
            }
            let kind: String = dt.getattr("kind")?.extract()?;
            let size: usize = dt.getattr("itemsize")?.extract()?;
            if size != 2 || !(kind == "u" || kind == "i") {
                return Err(errors::invalid_argument(&format!(
                    "dtype=\"bfloat16\" reinterprets 16-bit integer arrays; got {}",
                    dt.str()?
                )));
            }
            arr.call_method1("view", (np_bf,))
        }
        other => Err(errors::invalid_argument(&format!(
            "unknown dtype tag `{other}` (only \"bfloat16\" is accepted)"
        ))),
    }
}

/// An input array ready to borrow: a NumPy array of a supported dtype, aligned and in
/// native byte order (other arrays are converted, which copies once).
pub(crate) fn input<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    tag: Option<&str>,
) -> PyResult<(Bound<'py, PyUntypedArray>, DType)> {
    let py = obj.py();
    let np = numpy_mod(py)?;
    let mut arr = match obj.cast::<PyUntypedArray>() {
        Ok(a) => a.clone().into_any(),
        Err(_) => np.call_method1("asarray", (obj,))?,
    };
    arr = apply_tag(arr, tag)?;
    let mut u = arr.cast_into::<PyUntypedArray>()?;
    let native = u.dtype().is_native_byteorder() != Some(false);
    // Broadcast arrays repeat elements, which ndarray views must not: copied (rare).
    if !u.is_aligned() || !native || overlapping(&u) {
        // A fresh array is aligned and native: `np.array(a, dtype=a.dtype.newbyteorder("="))`.
        let dt = u.dtype().into_any().call_method1("newbyteorder", ("=",))?;
        let kw = PyDict::new(py);
        kw.set_item("dtype", dt)?;
        u = np
            .call_method("array", (u,), Some(&kw))?
            .cast_into::<PyUntypedArray>()?;
    }
    match dtype_of(&u)? {
        Some(dt) => Ok((u, dt)),
        None => Err(errors::unsupported_dtype(
            name,
            &u.dtype().str()?.to_string(),
        )),
    }
}

/// Whether some element is reachable by two indices (a zero stride on an axis longer
/// than 1, as `np.broadcast_to` makes).
fn overlapping(arr: &Bound<'_, PyUntypedArray>) -> bool {
    !arr.is_empty()
        && arr
            .shape()
            .iter()
            .zip(arr.strides())
            .any(|(&n, &s)| n > 1 && s == 0)
}

/// Borrow an input array for reading.
pub(crate) fn read<'py>(arr: &Bound<'py, PyUntypedArray>, dt: DType) -> PyResult<ReadGuard<'py>> {
    if arr.is_empty() {
        return Ok(ReadGuard::Empty(dt, arr.shape().to_vec()));
    }
    with_dtype!(dt, T => read_typed::<T>(arr))
}

fn read_typed<'py, T: PyElement>(arr: &Bound<'py, PyUntypedArray>) -> PyResult<ReadGuard<'py>> {
    let typed = arr.cast::<PyArrayDyn<T>>()?;
    let g = typed.try_readonly().map_err(|e| {
        errors::invalid_argument(&format!("cannot read the array: {e} (is it passed twice?)"))
    })?;
    Ok(T::read(g))
}

/// Borrow a caller's array for an in-place write: a writable, aligned, native-order NumPy
/// array (never converted, since a copy would not reach the caller).
pub(crate) fn output<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<(WriteGuard<'py>, DType)> {
    let arr = obj.cast::<PyUntypedArray>().map_err(|_| {
        errors::invalid_argument(&format!(
            "`into[{name:?}]` must be a NumPy array (got {})",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    if !arr.is_aligned() || arr.dtype().is_native_byteorder() == Some(false) {
        return Err(errors::invalid_argument(&format!(
            "`into[{name:?}]` is misaligned or not in native byte order; it cannot be written in place"
        )));
    }
    if overlapping(arr) {
        return Err(errors::invalid_argument(&format!(
            "`into[{name:?}]` repeats elements (a zero stride); it cannot be written in place"
        )));
    }
    let writeable: bool = arr.getattr("flags")?.getattr("writeable")?.extract()?;
    if !writeable {
        return Err(errors::invalid_argument(&format!(
            "`into[{name:?}]` is read-only"
        )));
    }
    let Some(dt) = dtype_of(arr)? else {
        return Err(errors::unsupported_dtype(
            name,
            &arr.dtype().str()?.to_string(),
        ));
    };
    if arr.is_empty() {
        return Ok((WriteGuard::Empty(dt, arr.shape().to_vec()), dt));
    }
    let g = with_dtype!(dt, T => write_typed::<T>(arr, name))?;
    Ok((g, dt))
}

fn write_typed<'py, T: PyElement>(
    arr: &Bound<'py, PyUntypedArray>,
    name: &str,
) -> PyResult<WriteGuard<'py>> {
    let typed = arr.cast::<PyArrayDyn<T>>()?;
    let g = typed.try_readwrite().map_err(|e| {
        errors::invalid_argument(&format!(
            "cannot write `into[{name:?}]`: {e} (the same array given twice, or one also read?)"
        ))
    })?;
    Ok(T::write(g))
}

/// A materialized copy of a tensor.
pub(crate) fn to_owned(t: &Tensor) -> Result<Owned, Error> {
    fn typed<T: PyElement>(t: &Tensor) -> Result<Owned, Error> {
        Ok(T::owned(t.to_array::<T>()?))
    }
    let dt = t.dtype();
    let f = || -> PyResult<Result<Owned, Error>> { Ok(with_dtype!(dt, T => typed::<T>(t))) };
    f().unwrap_or_else(|_| {
        Err(Error::UnsupportedDType {
            name: String::new(),
            dtype: dt,
            operation: "conversion to NumPy",
        })
    })
}

/// Check that `out` can receive `t` (dtype and shape), naming the variable.
pub(crate) fn check_target(name: &str, t: &Tensor, out: &ViewMut<'_>) -> Result<(), Error> {
    let (dtype, shape) = on_view_mut!(out, v => (elem_dtype(v), v.shape().to_vec()));
    if dtype != t.dtype() {
        return Err(Error::DTypeMismatch {
            name: name.to_owned(),
            expected: t.dtype(),
            found: dtype,
        });
    }
    if shape != t.shape() {
        return Err(Error::ShapeMismatch {
            name: name.to_owned(),
            expected: t.shape().to_vec(),
            found: shape,
        });
    }
    Ok(())
}

fn elem_dtype<T: Element>(_: &ArrayViewMutD<'_, T>) -> DType {
    T::DTYPE
}

/// Write `t` into `out`, touching only chunks that differ. With `known` (a tensor `out` is
/// known to hold), chunks shared with it are skipped without reading `out`; otherwise each
/// chunk of `out` is compared with `t`'s bytes and copied only where they differ.
pub(crate) fn write_back(
    t: &Tensor,
    out: &mut ViewMut<'_>,
    known: Option<&Tensor>,
) -> Result<WriteStats, Error> {
    on_view_mut!(out, v => match known {
        Some(k) => t.copy_changed_into(v, k),
        None => compare_copy(t, v),
    })
}

/// Below this many bytes a write-back runs on the calling thread.
const PAR_MIN_BYTES: usize = 4 << 20;

fn compare_copy<T: Element>(
    t: &Tensor,
    out: &mut ArrayViewMutD<'_, T>,
) -> Result<WriteStats, Error> {
    let chunks: Vec<&[T]> = t.chunk_slices::<T>()?.collect();
    let mut stats = WriteStats {
        chunks_total: chunks.len(),
        ..WriteStats::default()
    };
    let ce = t.chunk_elems().max(1);
    if let Some(flat) = out.as_slice_mut() {
        let job = |(dst, src): (&mut [T], &&[T])| -> usize {
            if bytemuck::cast_slice::<T, u8>(dst) == bytemuck::cast_slice::<T, u8>(src) {
                0
            } else {
                dst.copy_from_slice(src);
                1
            }
        };
        let changed: Vec<usize> = if t.nbytes() >= PAR_MIN_BYTES {
            tensor_history::parallel::install(|| {
                flat.par_chunks_mut(ce)
                    .zip(chunks.par_iter())
                    .map(job)
                    .collect()
            })
        } else {
            flat.chunks_mut(ce).zip(chunks.iter()).map(job).collect()
        };
        for (i, c) in changed.iter().enumerate() {
            if *c == 1 {
                stats.chunks_changed += 1;
                stats.bytes_copied += std::mem::size_of_val(chunks[i]);
            }
        }
    } else {
        // Any other layout: walk `out` in logical (row-major) order beside the chunks.
        let mut dst = out.iter_mut();
        for src in &chunks {
            let mut changed = false;
            for v in src.iter() {
                let d = dst.next().ok_or_else(|| Error::Internal {
                    reason: "tensor has more elements than its shape".into(),
                })?;
                if bytemuck::bytes_of(d) != bytemuck::bytes_of(v) {
                    *d = *v;
                    changed = true;
                }
            }
            if changed {
                stats.chunks_changed += 1;
                stats.bytes_copied += std::mem::size_of_val(*src);
            }
        }
    }
    Ok(stats)
}
