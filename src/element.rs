//! Element types a tensor can hold, and their runtime tag [`DType`].

use std::fmt;
use std::ops::{BitOr, BitXor};

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// The element type of a tensor, known at run time.
///
/// Chunk bytes hold elements in little-endian byte order, C (row-major) order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 half precision, [`half::f16`].
    F16,
    /// bfloat16, [`half::bf16`].
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
}

impl DType {
    /// Every dtype, in the order of their tags (the order of the variants).
    ///
    /// ```
    /// use tensor_history::DType;
    ///
    /// assert_eq!(DType::ALL.len(), 12);
    /// assert!(DType::ALL.contains(&DType::BF16));
    /// ```
    pub const ALL: [DType; 12] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
    ];

    /// Size of one element in bytes.
    #[must_use]
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Whether this is a floating-point type (the types `Mean` merges and `average` accept).
    #[must_use]
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Lower-case name, as in `f32` or `bf16`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
        }
    }

    /// A one-byte tag, used in content hashes.
    pub(crate) const fn tag(self) -> u8 {
        self as u8
    }

    /// The dtype of a [`tag`](DType::tag), `None` for a tag no dtype has. O(1).
    pub(crate) fn from_tag(tag: u8) -> Option<DType> {
        DType::ALL
            .get(usize::from(tag))
            .copied()
            .filter(|d| d.tag() == tag)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// An element type a tensor can hold: `f32, f64, f16, bf16, i8..i64, u8..u64`.
///
/// Sealed: the crate relies on every element being plain old data (any bit pattern is a
/// value, no padding) to view chunk bytes as typed slices.
pub trait Element:
    sealed::Sealed + bytemuck::Pod + PartialEq + fmt::Debug + Send + Sync + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DType;

    /// Unsigned integer of the same width, used for bitwise change checks.
    #[doc(hidden)]
    type Bits: Copy
        + Eq
        + Default
        + BitOr<Output = Self::Bits>
        + BitXor<Output = Self::Bits>
        + Send
        + Sync;

    /// The bit pattern of `self`.
    #[doc(hidden)]
    fn to_bits(self) -> Self::Bits;

    /// Convert to `f64` (exact for every float type; used by `Mean` merges and `average`).
    #[doc(hidden)]
    fn to_f64(self) -> f64;

    /// Convert from `f64` with the type's rounding (used by `Mean` merges and `average`).
    #[doc(hidden)]
    fn from_f64(v: f64) -> Self;
}

macro_rules! int_element {
    ($($t:ty => $d:ident, $bits:ty;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            type Bits = $bits;
            #[inline(always)]
            fn to_bits(self) -> $bits {
                self as $bits
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    )*};
}

int_element! {
    i8 => I8, u8;
    i16 => I16, u16;
    i32 => I32, u32;
    i64 => I64, u64;
    u8 => U8, u8;
    u16 => U16, u16;
    u32 => U32, u32;
    u64 => U64, u64;
}

macro_rules! float_element {
    ($($t:ty => $d:ident, $bits:ty, $to:expr, $from:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            type Bits = $bits;
            #[inline(always)]
            fn to_bits(self) -> $bits {
                <$t>::to_bits(self)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                let to: fn($t) -> f64 = $to;
                to(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                let from: fn(f64) -> $t = $from;
                from(v)
            }
        }
    )*};
}

float_element! {
    f32 => F32, u32, |x| x as f64, |v| v as f32;
    f64 => F64, u64, |x| x, |v| v;
    f16 => F16, u16, |x| x.to_f64(), f16::from_f64;
    bf16 => BF16, u16, |x| x.to_f64(), bf16::from_f64;
}

#[cfg(target_endian = "big")]
compile_error!(
    "tensor-history stores chunks as little-endian bytes and supports little-endian targets only"
);
