//! Shared harness of the criterion benches: the model (64 f32 tensors), the sizes and
//! fractions swept, which chunks a fraction changes, and the [`Keeper`] trait with the
//! store and the two deep-copy baselines behind it.
//!
//! Every bench target includes this module and uses part of it.
#![allow(dead_code)]

use std::hint::black_box;
use std::ops::Range;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};
use ndarray::{ArrayView2, ArrayViewMut2};
use tensor_history::{Config, Store, Tensor, VersionId, DEFAULT_CHUNK_BYTES};

/// Tensors in every model.
pub const TENSORS: usize = 64;
/// Columns of every tensor (4 KiB rows, so chunks hold whole rows).
pub const COLS: usize = 1024;
/// Learning rate of the dense update `w -= LR * g`.
pub const LR: f32 = 1e-3;

/// Fractions of chunks changed, with their labels.
pub const FRACTIONS: [(&str, f64); 5] = [
    ("0pct", 0.0),
    ("0.1pct", 0.001),
    ("1pct", 0.01),
    ("10pct", 0.1),
    ("100pct", 1.0),
];

/// Model sizes in MiB: 1, 16 and 256; 1024 too when `TH_BENCH_LARGE=1`.
pub fn sizes_mib() -> Vec<usize> {
    let mut v = vec![1, 16, 256];
    if std::env::var("TH_BENCH_LARGE").is_ok_and(|v| v == "1") {
        v.push(1024);
    }
    v
}

/// Modest criterion settings, so that `cargo bench` finishes in minutes.
pub fn criterion() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .without_plots()
}

/// A group for one topic at one model size: flat sampling (iterations at 256 MiB and
/// above take tens of milliseconds) and throughput in model bytes.
pub fn group<'a>(
    c: &'a mut Criterion,
    topic: &str,
    model: &Model,
) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(format!("{topic}/{}", model.label()));
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes(model.bytes() as u64));
    g
}

/// One chunk to change: tensor index and the chunk's flat element range.
pub type Sel = Vec<(usize, Range<usize>)>;

/// The model: `TENSORS` flat row-major f32 arrays of `rows x COLS`, and the store's
/// chunk layout for them (default `chunk_bytes`).
#[derive(Clone)]
pub struct Model {
    pub size_mib: usize,
    pub rows: usize,
    pub names: Vec<String>,
    pub data: Vec<Vec<f32>>,
    pub chunk_elems: usize,
    pub chunks_per_tensor: usize,
}

impl Model {
    pub fn new(size_mib: usize) -> Model {
        let elems = (size_mib << 20) / TENSORS / std::mem::size_of::<f32>();
        let rows = (elems / COLS).max(1);
        let data: Vec<Vec<f32>> = (0..TENSORS)
            .map(|t| {
                (0..rows * COLS)
                    .map(|i| 1.0 + ((i * 31 + t * 7) % 997) as f32 * 1e-3)
                    .collect()
            })
            .collect();
        let probe = ArrayView2::from_shape((rows, COLS), &data[0][..]).expect("shape fits");
        let probe = Tensor::from_array(&probe, DEFAULT_CHUNK_BYTES).expect("valid chunk size");
        Model {
            size_mib,
            rows,
            names: (0..TENSORS)
                .map(|t| format!("layer{t:02}.weight"))
                .collect(),
            data,
            chunk_elems: probe.chunk_elems(),
            chunks_per_tensor: probe.num_chunks(),
        }
    }

    pub fn label(&self) -> String {
        format!("{}MiB", self.size_mib)
    }

    pub fn bytes(&self) -> usize {
        self.data.iter().map(|d| d.len() * 4).sum()
    }

    pub fn view(&self, t: usize) -> ArrayView2<'_, f32> {
        ArrayView2::from_shape((self.rows, COLS), &self.data[t][..]).expect("shape fits")
    }

    /// `share` of all chunks (none for 0, at least one otherwise), spread evenly.
    pub fn pick(&self, share: f64) -> Sel {
        let total = self.chunks_per_tensor * TENSORS;
        let n = if share <= 0.0 {
            0
        } else {
            ((total as f64 * share).round() as usize).clamp(1, total)
        };
        (0..n)
            .map(|k| {
                let g = k * total / n;
                let (t, i) = (g / self.chunks_per_tensor, g % self.chunks_per_tensor);
                let start = i * self.chunk_elems;
                (t, start..(start + self.chunk_elems).min(self.rows * COLS))
            })
            .collect()
    }

    /// A copy with the chunks of `sel` changed.
    pub fn changed(&self, sel: &Sel) -> Model {
        let mut m = self.clone();
        for (t, r) in sel {
            bump(&mut m.data[*t][r.clone()]);
        }
        m
    }

    /// A gradient-like array per tensor, nonzero everywhere.
    pub fn grads(&self) -> Vec<Vec<f32>> {
        self.data
            .iter()
            .enumerate()
            .map(|(t, d)| {
                (0..d.len())
                    .map(|i| 0.5 + ((i * 13 + t) % 101) as f32 * 1e-2)
                    .collect()
            })
            .collect()
    }
}

/// The change made to a chosen chunk: add one to every element.
pub fn bump(xs: &mut [f32]) {
    xs.iter_mut().for_each(|x| *x += 1.0);
}

pub fn sgd_in_place(w: &mut [f32], g: &[f32]) {
    for (w, g) in w.iter_mut().zip(g) {
        *w -= LR * *g;
    }
}

/// Chunks whose bytes differ between two flat arrays (memcmp per chunk).
pub fn changed_chunks_bytes(a: &[f32], b: &[f32], chunk_elems: usize) -> usize {
    a.chunks(chunk_elems)
        .zip(b.chunks(chunk_elems))
        .filter(|(x, y)| bytemuck::cast_slice::<f32, u8>(x) != bytemuck::cast_slice::<f32, u8>(y))
        .count()
}

/// A way to keep the model's previous state restorable: the store, or deep copies.
///
/// Operations are the user-level steps of a training loop; each keeper does them its
/// own best way. `commit` saves the working state as the one to go back to; `rollback`
/// makes the working state equal the saved one again.
pub trait Keeper {
    /// Label in the bench ids.
    const NAME: &'static str;
    /// Take the model as the working state, and commit it.
    fn load(model: &Model) -> Self;
    /// Save the working state (the store: a commit; deep copies: a copy).
    fn commit(&mut self);
    /// Working state := the last saved state.
    fn rollback(&mut self);
    /// Change the chunks of `sel` in the working state, in place.
    fn touch(&mut self, sel: &Sel);
    /// `w -= LR * g` over every element of the working state.
    fn sgd(&mut self, g: &[Vec<f32>]);
    /// Overwrite the working state from `src` (same shapes).
    fn write_from(&mut self, src: &Model);
    /// Chunks that differ between the saved and the working state.
    fn changed_chunks(&self) -> usize;
    /// Write into `out` (buffers the keeper does not own) the saved state if `to_saved`,
    /// else the working state; `out` is known to hold the other one.
    fn restore_into(&self, out: &mut [Vec<f32>], to_saved: bool);
}

/// The store under test; keeps at most two versions, as a trial loop would.
pub struct StoreKeeper {
    pub store: Store,
    names: Vec<String>,
    rows: usize,
    saved: Option<VersionId>,
}

impl StoreKeeper {
    /// A store holding the model without any commit: every chunk uniquely owned.
    pub fn uncommitted(model: &Model) -> StoreKeeper {
        let mut store = Store::with_config(Config {
            max_versions: Some(2),
            ..Config::default()
        })
        .expect("valid config");
        for t in 0..TENSORS {
            store
                .insert(&model.names[t], &model.view(t))
                .expect("insert");
        }
        StoreKeeper {
            store,
            names: model.names.clone(),
            rows: model.rows,
            saved: None,
        }
    }
}

impl Keeper for StoreKeeper {
    const NAME: &'static str = "store";

    fn load(model: &Model) -> Self {
        let mut k = StoreKeeper::uncommitted(model);
        k.commit();
        k
    }

    fn commit(&mut self) {
        self.saved = Some(self.store.commit("step").expect("commit"));
    }

    fn rollback(&mut self) {
        self.store
            .restore(self.saved.expect("committed"))
            .expect("restore");
    }

    fn touch(&mut self, sel: &Sel) {
        for (t, r) in sel {
            self.store
                .update_range::<f32>(&self.names[*t], r.clone(), |_, xs| bump(xs))
                .expect("update_range");
        }
    }

    fn sgd(&mut self, g: &[Vec<f32>]) {
        for (t, g) in g.iter().enumerate() {
            let g = ArrayView2::from_shape((self.rows, COLS), &g[..]).expect("shape");
            self.store
                .zip_update::<f32, _, _>(&self.names[t], &g, |w, g| w - LR * g)
                .expect("zip_update");
        }
    }

    fn write_from(&mut self, src: &Model) {
        for t in 0..TENSORS {
            black_box(
                self.store
                    .write(&self.names[t], &src.view(t))
                    .expect("write"),
            );
        }
    }

    fn changed_chunks(&self) -> usize {
        self.store.diff_working().changed_chunks()
    }

    fn restore_into(&self, out: &mut [Vec<f32>], to_saved: bool) {
        let saved = self
            .store
            .snapshot(self.saved.expect("committed"))
            .expect("snapshot");
        for (t, name) in self.names.iter().enumerate() {
            let working = self.store.tensor(name).expect("tensor");
            let (target, known) = if to_saved {
                (saved.tensor(name).expect("tensor"), working)
            } else {
                (working, saved.tensor(name).expect("tensor"))
            };
            let mut v =
                ArrayViewMut2::from_shape((self.rows, COLS), &mut out[t][..]).expect("shape");
            black_box(target.copy_changed_into(&mut v, known).expect("copy"));
        }
    }
}

/// Deep copies the way users write them: `saved = {k: v.clone()}`, restore by cloning
/// back. Every save allocates (and the old copy is freed).
pub struct CloneKeeper {
    working: Vec<Vec<f32>>,
    saved: Vec<Vec<f32>>,
    chunk_elems: usize,
}

impl Keeper for CloneKeeper {
    const NAME: &'static str = "clone";

    fn load(model: &Model) -> Self {
        CloneKeeper {
            working: model.data.clone(),
            saved: model.data.clone(),
            chunk_elems: model.chunk_elems,
        }
    }

    fn commit(&mut self) {
        self.saved = self.working.clone();
    }

    fn rollback(&mut self) {
        self.working = self.saved.clone();
    }

    fn touch(&mut self, sel: &Sel) {
        for (t, r) in sel {
            bump(&mut self.working[*t][r.clone()]);
        }
    }

    fn sgd(&mut self, g: &[Vec<f32>]) {
        for (w, g) in self.working.iter_mut().zip(g) {
            sgd_in_place(w, g);
        }
    }

    fn write_from(&mut self, src: &Model) {
        self.working = src.data.clone();
    }

    /// Element-wise `==` per chunk (what `array_equal` does).
    fn changed_chunks(&self) -> usize {
        self.working
            .iter()
            .zip(&self.saved)
            .map(|(a, b)| {
                a.chunks(self.chunk_elems)
                    .zip(b.chunks(self.chunk_elems))
                    .filter(|(x, y)| x != y)
                    .count()
            })
            .sum()
    }

    fn restore_into(&self, out: &mut [Vec<f32>], to_saved: bool) {
        let src = if to_saved { &self.saved } else { &self.working };
        for (o, s) in out.iter_mut().zip(src) {
            o.copy_from_slice(s);
        }
    }
}

/// The best a deep copy can do: copy into buffers allocated (and touched) once.
pub struct CopyKeeper {
    working: Vec<Vec<f32>>,
    saved: Vec<Vec<f32>>,
    chunk_elems: usize,
}

impl Keeper for CopyKeeper {
    const NAME: &'static str = "copy_prealloc";

    fn load(model: &Model) -> Self {
        CopyKeeper {
            working: model.data.clone(),
            saved: model.data.clone(),
            chunk_elems: model.chunk_elems,
        }
    }

    fn commit(&mut self) {
        for (s, w) in self.saved.iter_mut().zip(&self.working) {
            s.copy_from_slice(w);
        }
    }

    fn rollback(&mut self) {
        for (w, s) in self.working.iter_mut().zip(&self.saved) {
            w.copy_from_slice(s);
        }
    }

    fn touch(&mut self, sel: &Sel) {
        for (t, r) in sel {
            bump(&mut self.working[*t][r.clone()]);
        }
    }

    fn sgd(&mut self, g: &[Vec<f32>]) {
        for (w, g) in self.working.iter_mut().zip(g) {
            sgd_in_place(w, g);
        }
    }

    fn write_from(&mut self, src: &Model) {
        for (w, s) in self.working.iter_mut().zip(&src.data) {
            w.copy_from_slice(s);
        }
    }

    /// Byte compare (memcmp) per chunk.
    fn changed_chunks(&self) -> usize {
        self.working
            .iter()
            .zip(&self.saved)
            .map(|(a, b)| changed_chunks_bytes(a, b, self.chunk_elems))
            .sum()
    }

    fn restore_into(&self, out: &mut [Vec<f32>], to_saved: bool) {
        let src = if to_saved { &self.saved } else { &self.working };
        for (o, s) in out.iter_mut().zip(src) {
            o.copy_from_slice(s);
        }
    }
}
