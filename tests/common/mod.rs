//! Shared test fixtures: one table of boundary sizes used by every test file.
#![allow(dead_code)]

use ndarray::{ArrayD, IxDyn};
use tensor_history::{Config, Store};

/// Chunk size used by the boundary tests: 64 bytes = 16 `f32` elements per chunk.
pub const CHUNK_BYTES: usize = 64;
/// `f32` elements in one full chunk at [`CHUNK_BYTES`].
pub const CHUNK_F32: usize = CHUNK_BYTES / 4;

/// Shapes at the boundaries of the chunk layout, for `CHUNK_BYTES` and `f32`:
/// empty, one element, one chunk minus/exactly/plus one element, two chunks plus one,
/// a scalar, zero-length axes, rows that fit a chunk exactly or with a remainder, rows
/// larger than a chunk (split rows), and a 3-D tensor.
pub const BOUNDARY_SHAPES: &[&[usize]] = &[
    &[0],
    &[1],
    &[CHUNK_F32 - 1],
    &[CHUNK_F32],
    &[CHUNK_F32 + 1],
    &[2 * CHUNK_F32 + 1],
    &[],
    &[0, 5],
    &[5, 0],
    &[4, 4],
    &[5, 3],
    &[3, 20],
    &[2, 17],
    &[2, 3, 4],
    &[7, 2, 3],
];

/// A store with [`CHUNK_BYTES`] chunks.
pub fn small_store() -> Store {
    Store::with_config(Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    })
    .expect("valid config")
}

/// The start of the small repositories of the damage tests: 64-byte chunks, `w` (f32,
/// 6 x 8, several chunks) and `b` (i16, 5 elements), committed as v0 `init`, then `w`
/// doubled and committed as v1 `double`.
pub fn init_and_double() -> (Store, tensor_history::VersionId, tensor_history::VersionId) {
    let mut store = small_store();
    store
        .insert(
            "w",
            &ndarray::Array2::from_shape_fn((6, 8), |(i, j)| (i * 8 + j) as f32),
        )
        .unwrap();
    store
        .insert("b", &ndarray::Array1::from_shape_fn(5, |i| i as i16 - 2))
        .unwrap();
    let v0 = store.commit("init").unwrap();
    store.update_map::<f32>("w", |x| x * 2.0).unwrap();
    let v1 = store.commit("double").unwrap();
    (store, v0, v1)
}

/// A deterministic array of `shape` whose values differ by position and `seed`.
pub fn ramp(shape: &[usize], seed: f32) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    ArrayD::from_shape_vec(
        IxDyn(shape),
        (0..n).map(|i| i as f32 * 0.5 + seed).collect(),
    )
    .expect("shape matches length")
}

// ---- helpers shared by tensor_writes.rs and tensor_writes_model.rs --------------------

/// Elements of a tensor of `shape`.
pub fn len_of(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The elements of `a` in logical (row-major) order.
pub fn flat(a: &ArrayD<f32>) -> Vec<f32> {
    a.iter().copied().collect()
}

/// Indices of the chunks of `t` that are not pointer-shared with the same chunk of `base`.
pub fn unshared(t: &tensor_history::Tensor, base: &tensor_history::Tensor) -> Vec<usize> {
    (0..t.num_chunks())
        .filter(|&i| !t.chunk(i).unwrap().ptr_eq(base.chunk(i).unwrap()))
        .collect()
}

/// Chunks (of `chunk_elems` elements) that hold any of the flat indices in `elems`.
pub fn chunks_of(elems: impl IntoIterator<Item = usize>, chunk_elems: usize) -> Vec<usize> {
    let set: std::collections::BTreeSet<usize> =
        elems.into_iter().map(|i| i / chunk_elems).collect();
    set.into_iter().collect()
}

/// Cases per property test: `TH_PROPTEST_CASES` (or proptest's own `PROPTEST_CASES`)
/// from the environment, else `default`. Long oracle runs set it in release builds.
pub fn cases(default: u32) -> u32 {
    ["TH_PROPTEST_CASES", "PROPTEST_CASES"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
        .unwrap_or(default)
}

/// Chunk lengths in bytes at the boundaries of the codec's byte planes: empty, shorter
/// than every element width, one element of each width and one byte more or less, a
/// few whole elements with a remainder, and full chunks of common sizes.
pub const CODEC_CHUNK_LENS: &[usize] = &[
    0,
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    9,
    15,
    16,
    17,
    63,
    64,
    65,
    1000,
    4096,
    65_536 + 3,
    256 * 1024,
];

/// What a repository (or a store) holds, by content address: refs, HEAD and every
/// version's contents.
#[derive(Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub head: Option<tensor_history::ContentHash>,
    pub branch: Option<String>,
    pub refs: std::collections::BTreeMap<String, (bool, tensor_history::ContentHash)>,
    pub versions:
        std::collections::BTreeMap<tensor_history::ContentHash, tensor_history::ContentHash>,
}

pub fn fingerprint(s: &Store) -> Fingerprint {
    let h = |id| s.version_hash(id).unwrap();
    Fingerprint {
        head: s.head().map(h),
        branch: s.current_branch().map(str::to_owned),
        refs: s
            .refs()
            .into_iter()
            .map(|(n, r)| {
                (
                    n,
                    (matches!(r, tensor_history::Ref::Branch(_)), h(r.target())),
                )
            })
            .collect(),
        versions: s
            .versions()
            .into_iter()
            .map(|id| (h(id), s.snapshot(id).unwrap().content_hash()))
            .collect(),
    }
}

/// How a child process ended.
#[cfg(unix)]
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Exited with this status.
    Exited(i32),
    /// Killed by this signal.
    Signal(i32),
    /// Still running after 60 s: killed.
    Hung,
}

/// Fork; the child runs `child` and exits 0 if it returns true. The parent waits up to
/// 60 s.
#[cfg(unix)]
#[allow(unsafe_code)]
pub fn in_child(child: impl FnOnce() -> bool) -> Ended {
    // SAFETY: the child only runs `child` and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(false);
        // SAFETY: ends the child without running the parent's destructors or test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut status = 0;
    loop {
        // SAFETY: plain system calls on the child's pid.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            if libc::WIFSIGNALED(status) {
                return Ended::Signal(libc::WTERMSIG(status));
            }
            return Ended::Exited(libc::WEXITSTATUS(status));
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: as above.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Ended::Hung;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Chunk size of the dense tests: a delta of a dense step codes to about a quarter of a
/// 4 KiB chunk, where a [`CHUNK_BYTES`] chunk never pays for a delta's header.
pub const DENSE_CHUNK_BYTES: usize = 4 << 10;

/// `elems` weights after `step` dense training steps: every element moves by a relative
/// step of up to 1e-5 each step (as a small learning rate does), so consecutive steps
/// differ in every element but share their sign, exponent and high mantissa bits, and a
/// save stores them as XOR deltas against the previous step. O(elems) for any step.
pub fn dense_weights(elems: usize, step: usize) -> ArrayD<f32> {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut unit = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    ArrayD::from_shape_fn(IxDyn(&[elems]), |_| {
        let w = unit() * 0.1;
        w * (1.0 + step as f32 * 1e-5 * unit())
    })
}

/// Whether `a` and `b` hold the same bits (NaNs and signed zeros included).
/// Bytes of every object a repository's backend lists.
pub fn repo_bytes(b: &dyn tensor_history::Backend) -> u64 {
    b.list("").unwrap().iter().map(|o| o.size).sum()
}

pub fn same_bits(a: &ArrayD<f32>, b: &ArrayD<f32>) -> bool {
    a.shape() == b.shape()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits())
}
