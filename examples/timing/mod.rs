//! Timing shared by the measurement examples (`bench_report`, `cost_table`): runs of the
//! store and of a baseline interleaved in one process, reported as medians.

// Each example uses a different part of this module.
#![allow(dead_code)]

use std::error::Error;
use std::hint::black_box;
use std::time::{Duration, Instant};

pub type Res<T> = Result<T, Box<dyn Error>>;

/// One timed run: returns how long the measured work took.
pub type Run<'a> = &'a mut dyn FnMut() -> Res<Duration>;

/// Time `f` alone: its result goes through `black_box` (so the work cannot be optimized
/// away) and is dropped after the clock stops.
pub fn timed<R>(f: impl FnOnce() -> Res<R>) -> Res<Duration> {
    let t = Instant::now();
    let r = black_box(f()?);
    let d = t.elapsed();
    drop(r);
    Ok(d)
}

/// [`timed`] for infallible work.
pub fn clock<R>(f: impl FnOnce() -> R) -> Res<Duration> {
    timed(|| Ok(f()))
}

pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// One untimed warm-up run of each, then `reps` rounds in which every run goes once, the
/// order rotating each round. Returns the median milliseconds of each run.
pub fn interleave(reps: usize, runs: &mut [Run<'_>]) -> Res<Vec<f64>> {
    for r in runs.iter_mut() {
        r()?;
    }
    let n = runs.len();
    let mut times = vec![Vec::with_capacity(reps); n];
    for rep in 0..reps {
        for k in 0..n {
            let i = (k + rep) % n;
            times[i].push(runs[i]()?.as_secs_f64() * 1e3);
        }
    }
    Ok(times.into_iter().map(median).collect())
}
