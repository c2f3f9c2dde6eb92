//! Code shared by the examples: a tiny deterministic PRNG, the two-spirals data set, a
//! small multi-layer perceptron in plain ndarray, and `--flag value` parsing.
//!
//! The model reads its weights as *row tiles* (blocks of whole rows of each matrix), the
//! way the store hands out its chunks ([`Tensor::row_blocks`]): the forward and backward
//! passes then compute straight from the store's memory, without materializing a copy.
//! A plain `Vec` of arrays is cut into the same tiles, so the deep-copy baseline and the
//! store run the very same float operations in the same order and can be compared bit
//! for bit.

// Each example uses a different part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::error::Error;
use std::ops::Range;

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array1, Array2, ArrayD, ArrayView1, ArrayViewD, Axis, Ix1, Ix2};
use tensor_history::{Store, Tensor, DEFAULT_CHUNK_BYTES};

pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

// ---- random numbers ------------------------------------------------------------------

/// SplitMix64: a tiny, fast, deterministic generator (Steele, Lea and Flood, 2014).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The whole state: `SplitMix64::new(rng.state())` continues where `rng` is.
    pub fn state(&self) -> u64 {
        self.0
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

// ---- data ----------------------------------------------------------------------------

/// Points in the plane with a class label.
#[derive(Clone, Debug)]
pub struct Dataset {
    pub x: Array2<f32>,
    pub y: Vec<usize>,
}

pub const CLASSES: usize = 2;

impl Dataset {
    /// Two interleaved spirals (1.5 turns each), one per class, with Gaussian noise.
    pub fn two_spirals(n: usize, noise: f32, rng: &mut SplitMix64) -> Dataset {
        let mut x = Array2::zeros((n, 2));
        let mut y = Vec::with_capacity(n);
        for i in 0..n {
            let class = i % CLASSES;
            let t = rng.uniform().sqrt();
            let angle = t * 3.0 * std::f32::consts::PI + class as f32 * std::f32::consts::PI;
            x[[i, 0]] = 2.0 * t * angle.cos() + noise * rng.normal();
            x[[i, 1]] = 2.0 * t * angle.sin() + noise * rng.normal();
            y.push(class);
        }
        Dataset { x, y }
    }

    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// `n` points drawn at random (with replacement).
    pub fn sample(&self, n: usize, rng: &mut SplitMix64) -> Dataset {
        let idx: Vec<usize> = (0..n).map(|_| rng.below(self.len())).collect();
        Dataset {
            x: self.x.select(Axis(0), &idx),
            y: idx.iter().map(|&i| self.y[i]).collect(),
        }
    }

    /// Points `range`, in order.
    pub fn slice(&self, range: Range<usize>) -> Dataset {
        Dataset {
            x: self.x.slice(s![range.clone(), ..]).to_owned(),
            y: self.y[range].to_vec(),
        }
    }
}

// ---- parameters ----------------------------------------------------------------------

/// Parameters as the deep-copy baseline holds them: name and array, in model order.
pub type Weights = Vec<(String, ArrayD<f32>)>;

/// An MLP 2 -> hidden -> hidden -> 2 with ReLU, He-initialized; biases start at zero.
/// Weight matrices are `[out, in]`, so a row tile of a matrix is a block of output units.
pub fn init_mlp(hidden: usize, rng: &mut SplitMix64) -> Weights {
    let mut layer = |name: &str, out: usize, inp: usize| {
        let scale = (2.0 / inp as f32).sqrt();
        let w = Array2::from_shape_simple_fn((out, inp), || scale * rng.normal());
        [
            (format!("w{name}"), w.into_dyn()),
            (format!("b{name}"), Array1::<f32>::zeros(out).into_dyn()),
        ]
    };
    let mut params = Vec::new();
    params.extend(layer("1", hidden, 2));
    params.extend(layer("2", hidden, hidden));
    params.extend(layer("3", CLASSES, hidden));
    params
}

/// Bytes of a set of parameters.
pub fn nbytes(params: &Weights) -> usize {
    params.iter().map(|(_, a)| a.len() * 4).sum()
}

/// One SGD update of one weight. Both runs use this function, so their arithmetic is
/// the same.
#[inline]
pub fn sgd(w: f32, g: f32, lr: f32) -> f32 {
    w - lr * g
}

/// Read access to the parameters as row tiles `(rows, view)`, in order.
pub trait Params {
    fn tiles(&self, name: &str) -> Result<Vec<(Range<usize>, ArrayViewD<'_, f32>)>>;
}

/// Rows per tile: the rows of a chunk of the store's default size ([`DEFAULT_CHUNK_BYTES`]).
pub fn tile_rows(shape: &[usize]) -> usize {
    let row: usize = shape.iter().skip(1).product();
    (DEFAULT_CHUNK_BYTES / 4 / row.max(1)).max(1)
}

/// The baseline cuts its arrays into the tiles the store's chunks hold.
impl Params for Weights {
    fn tiles(&self, name: &str) -> Result<Vec<(Range<usize>, ArrayViewD<'_, f32>)>> {
        let (_, a) = self
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("no parameter `{name}`"))?;
        let rows = tile_rows(a.shape());
        Ok(a.axis_chunks_iter(Axis(0), rows)
            .enumerate()
            .map(|(i, v)| (i * rows..i * rows + v.len_of(Axis(0)), v))
            .collect())
    }
}

/// The store hands out its chunks: zero-copy.
impl Params for Store {
    fn tiles(&self, name: &str) -> Result<Vec<(Range<usize>, ArrayViewD<'_, f32>)>> {
        Ok(self.tensor(name)?.row_blocks::<f32>()?.collect())
    }
}

/// Whether a stored tensor is cut into the tiles [`tile_rows`] describes (so that both
/// runs compute in the same order).
pub fn same_tiling(t: &Tensor) -> bool {
    t.rows_per_chunk() == Some(tile_rows(t.shape()))
}

// ---- the model -----------------------------------------------------------------------

/// `x · Wᵀ + b`, one tile of output units at a time.
fn linear(p: &impl Params, w: &str, b: &str, x: &Array2<f32>) -> Result<Array2<f32>> {
    let wt = p.tiles(w)?;
    let out_dim: usize = wt.last().map_or(0, |(r, _)| r.end);
    let mut out = Array2::zeros((x.nrows(), out_dim));
    for (rows, tile) in &wt {
        let tile = tile.view().into_dimensionality::<Ix2>()?;
        general_mat_mul(
            1.0,
            x,
            &tile.t(),
            0.0,
            &mut out.slice_mut(s![.., rows.clone()]),
        );
    }
    for (rows, tile) in p.tiles(b)? {
        let tile: ArrayView1<f32> = tile.into_dimensionality::<Ix1>()?;
        let mut block = out.slice_mut(s![.., rows]);
        block += &tile;
    }
    Ok(out)
}

/// `dout · W`: the gradient with respect to a layer's input, summed over tiles of W.
fn linear_back_input(p: &impl Params, w: &str, dout: &Array2<f32>) -> Result<Array2<f32>> {
    let wt = p.tiles(w)?;
    let in_dim = wt.first().map_or(0, |(_, t)| t.shape()[1]);
    let mut dx = Array2::zeros((dout.nrows(), in_dim));
    for (i, (rows, tile)) in wt.iter().enumerate() {
        let tile = tile.view().into_dimensionality::<Ix2>()?;
        let beta = if i == 0 { 0.0 } else { 1.0 };
        general_mat_mul(1.0, &dout.slice(s![.., rows.clone()]), &tile, beta, &mut dx);
    }
    Ok(dx)
}

fn relu(z: &Array2<f32>) -> Array2<f32> {
    z.mapv(|v| v.max(0.0))
}

/// Mean softmax cross-entropy, its gradient with respect to the logits, and accuracy.
fn softmax_xent(logits: &Array2<f32>, y: &[usize]) -> (f32, Array2<f32>, f32) {
    let n = logits.nrows();
    let mut grad = Array2::zeros(logits.raw_dim());
    let mut loss = 0.0f64;
    let mut correct = 0usize;
    for (i, row) in logits.rows().into_iter().enumerate() {
        let max = row.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let exps: Vec<f32> = row.iter().map(|&v| (v - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        loss += f64::from(sum.ln() - (row[y[i]] - max));
        let pred = (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap_or(0);
        correct += usize::from(pred == y[i]);
        for (j, e) in exps.iter().enumerate() {
            let target = if j == y[i] { 1.0 } else { 0.0 };
            grad[[i, j]] = (e / sum - target) / n as f32;
        }
    }
    (
        (loss / n as f64) as f32,
        grad,
        correct as f32 / n.max(1) as f32,
    )
}

/// Mean loss and accuracy of the model on `data`.
pub fn evaluate(p: &impl Params, data: &Dataset) -> Result<(f32, f32)> {
    let h1 = relu(&linear(p, "w1", "b1", &data.x)?);
    let h2 = relu(&linear(p, "w2", "b2", &h1)?);
    let logits = linear(p, "w3", "b3", &h2)?;
    let (loss, _, acc) = softmax_xent(&logits, &data.y);
    Ok((loss, acc))
}

/// Loss on `batch` and the gradient of every parameter (same names and order as
/// [`init_mlp`]).
pub fn gradients(p: &impl Params, batch: &Dataset) -> Result<(f32, Weights)> {
    let x = &batch.x;
    let z1 = linear(p, "w1", "b1", x)?;
    let h1 = relu(&z1);
    let z2 = linear(p, "w2", "b2", &h1)?;
    let h2 = relu(&z2);
    let logits = linear(p, "w3", "b3", &h2)?;
    let (loss, d3, _) = softmax_xent(&logits, &batch.y);

    let mut d2 = linear_back_input(p, "w3", &d3)?;
    d2.zip_mut_with(&z2, |d, &z| *d = if z > 0.0 { *d } else { 0.0 });
    let mut d1 = linear_back_input(p, "w2", &d2)?;
    d1.zip_mut_with(&z1, |d, &z| *d = if z > 0.0 { *d } else { 0.0 });
    let mut grads = Weights::new();
    for (name, dout, input) in [("1", &d1, x), ("2", &d2, &h1), ("3", &d3, &h2)] {
        grads.push((format!("w{name}"), dout.t().dot(input).into_dyn()));
        grads.push((format!("b{name}"), dout.sum_axis(Axis(0)).into_dyn()));
    }
    Ok((loss, grads))
}

// ---- command line --------------------------------------------------------------------

/// `--name value` flags, checked against the names a program accepts.
#[derive(Debug, Default)]
pub struct Flags(HashMap<String, String>);

impl Flags {
    /// Parse `args` (without the program name). `--help` gives an error holding `usage`.
    pub fn parse(args: impl IntoIterator<Item = String>, known: &[&str]) -> Result<Flags> {
        let mut map = HashMap::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                return Err("help requested".into());
            }
            let name = arg
                .strip_prefix("--")
                .filter(|n| known.contains(n))
                .ok_or_else(|| format!("unknown argument `{arg}`"))?;
            let value = args
                .next()
                .ok_or_else(|| format!("`{arg}` needs a value"))?;
            map.insert(name.to_owned(), value);
        }
        Ok(Flags(map))
    }

    /// The value of `--name` parsed as a number, or `default`.
    pub fn number<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.0.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("`--{name} {v}`: expected a non-negative integer").into()),
        }
    }

    /// The value of `--name`, if given.
    pub fn string(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// Bytes as a short human string (KiB, MiB, GiB).
/// The parsed options, or (on bad flags) the error and the usage line on stderr and exit
/// status 2.
pub fn opts_or_exit<T>(parsed: Result<T>, usage: &str) -> T {
    parsed.unwrap_or_else(|e| {
        eprintln!("error: {e}\n{usage}");
        std::process::exit(2);
    })
}

pub fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1 << 20) as f64 {
        format!("{:.1} MiB", b / (1 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}
