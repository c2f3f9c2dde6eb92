//! Cost table: tensor-history operations beside their plain-ndarray equivalents on the
//! same data, measured side by side in one process.
//!
//! A. One f32 tensor of 256 MiB (`[65536, 1024]`) in a default `Store`:
//!    `Tensor::clone` vs `ArrayD::clone`; `update_range` of one element right after a
//!    commit (the copy-on-write of one chunk) vs an ndarray clone plus setting one
//!    element; `write` of an array equal to the tensor vs an ndarray clone.
//! B. A 1 GiB model of 64 f32 tensors `[4096, 1024]`, versions A and B differing in 0%,
//!    1% or 100% of the chunks: `commit`, `restore` and `undo` beside a deep copy of the
//!    model into preallocated buffers, and `diff(a, b)` beside comparing two deep copies
//!    (bitwise, piece by piece of the store's chunk size: the question `diff` answers).
//!
//! All runs of a table are interleaved: one untimed warm-up of each, then `--reps` rounds
//! (default 9) in which every run goes once, the order rotating each round; the median
//! is printed. Results are dropped outside the timed region. A run finds the caches as the
//! previous run left them, often flushed by a large copy: sub-microsecond store calls
//! then pay their cache and TLB misses. Ratio = baseline / store
//! (above 1: the store is cheaper). The tables go to stdout, machine facts to stderr.
//!
//! ```text
//! cargo run --release --example cost_table                # 256 MiB tensor, 1 GiB model
//! cargo run --release --example cost_table -- --quick     # 64 MiB tensor, 256 MiB model
//! cargo run --release --example cost_table -- --reps 15
//! ```

use std::cell::RefCell;
use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

use ndarray::{ArrayD, ArrayView2, ArrayViewMut2, IxDyn};
use rayon::prelude::*;
use tensor_history::Store;

mod timing;

use timing::{interleave, median, timed, Res};

const COLS: usize = 1024;
const TENSORS: usize = 64;

/// Deterministic contents in [1, 2): adding 1.0 changes every element.
fn fill(len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| 1.0 + ((i * 31 + salt * 7) % 997) as f32 * 1e-3)
        .collect()
}

fn fmt_ms(ms: f64) -> String {
    match ms {
        m if m >= 1e3 => format!("{:.2} s", m / 1e3),
        m if m >= 1.0 => format!("{m:.1} ms"),
        m if m >= 1e-3 => format!("{:.1} us", m * 1e3),
        m => format!("{:.0} ns", m * 1e6),
    }
}

fn fmt_ratio(r: f64) -> String {
    match r {
        r if r >= 1e4 => format!("{r:.1e}"),
        r if r >= 100.0 => format!("{r:.0}"),
        r if r >= 10.0 => format!("{r:.1}"),
        r => format!("{r:.2}"),
    }
}

/// A table row: operation, store call or share changed, store ms, baseline, baseline ms.
type Row = (&'static str, &'static str, f64, &'static str, f64);

/// Part A: one tensor of `rows x COLS` f32.
fn part_a(rows: usize, reps: usize) -> Res<Vec<Row>> {
    let len = rows * COLS;
    let arr = ArrayD::from_shape_vec(IxDyn(&[rows, COLS]), fill(len, 0))?;
    // One store for clone and update (shared by two runs), one kept equal to `arr`.
    let store_u = RefCell::new(Store::new());
    store_u.borrow_mut().insert("w", &arr)?;
    let mut store_w = Store::new();
    store_w.insert("w", &arr)?;
    let (chunk_bytes, chunks) = {
        let s = store_u.borrow();
        let t = s.tensor("w")?;
        (t.chunk_elems() * 4, t.num_chunks())
    };
    eprintln!(
        "A: one f32 tensor [{rows}, {COLS}] ({} MiB), Store::new(): {chunks} chunks of {} KiB",
        len >> 18,
        chunk_bytes >> 10
    );
    let mut k = 0usize;
    let arr = &arr;
    let nd_clone = &mut || timed(|| Ok(arr.clone()));
    let nd_set = &mut || {
        timed(|| {
            let mut c = arr.clone();
            c[[rows / 2, COLS / 2]] += 1.0;
            Ok(c)
        })
    };
    let st_clone = &mut || {
        let s = store_u.borrow();
        timed(|| Ok(s.tensor("w")?.clone()))
    };
    let st_update = &mut || {
        let mut s = store_u.borrow_mut();
        s.commit("before one-element update")?; // untimed: every chunk now shared
        k += 1;
        let i = (k * 7_919 * COLS + k) % len; // a different chunk each run
        timed(|| {
            let st = s.update_range::<f32>("w", i..i + 1, |_, xs| xs[0] += 1.0)?;
            assert_eq!((st.chunks_changed, st.bytes_copied), (1, chunk_bytes));
            Ok(st)
        })
    };
    let st_write = &mut || {
        timed(|| {
            let st = store_w.write("w", arr)?;
            assert_eq!(st.chunks_changed, 0, "write of equal data changed chunks");
            Ok(st)
        })
    };
    let m = interleave(reps, &mut [nd_clone, nd_set, st_clone, st_update, st_write])?;
    let (clone, upd) = ("ArrayD::clone", "commit; update_range(i..i+1)");
    Ok(vec![
        ("clone", "store.tensor(n)?.clone()", m[2], clone, m[0]),
        ("update 1 element", upd, m[3], "clone + set 1 element", m[1]),
        ("write equal array", "write(n, &equal)", m[4], clone, m[0]),
    ])
}

/// Part B: `TENSORS` tensors of `rows x COLS` f32.
fn part_b(rows: usize, reps: usize) -> Res<Vec<Row>> {
    let names: Vec<String> = (0..TENSORS).map(|t| format!("w{t:02}")).collect();
    let data: Vec<Vec<f32>> = (0..TENSORS)
        .into_par_iter()
        .map(|t| fill(rows * COLS, t))
        .collect();
    // Preallocated, touched buffers: the deep-copy target and a deep copy of version B.
    let mut bufs: Vec<Vec<f32>> = data.par_iter().map(|d| vec![1.0; d.len()]).collect();
    let mut copy_b = bufs.clone();
    eprintln!(
        "B: {TENSORS} f32 tensors [{rows}, {COLS}] ({} MiB); baselines run on rayon over the tensors",
        (TENSORS * rows * COLS) >> 18
    );
    let mut out = Vec::new();
    for (label, share) in [("0%", 0.0), ("1%", 0.01), ("100%", 1.0)] {
        let mut store = Store::new();
        for (n, d) in names.iter().zip(&data) {
            store.insert(n, &ArrayView2::from_shape((rows, COLS), &d[..])?)?;
        }
        let va = store.commit("A")?;
        let (per, ce) = {
            let t = store.tensor(&names[0])?;
            (t.num_chunks(), t.chunk_elems())
        };
        let total = per * TENSORS;
        let n_changed = if share >= 1.0 {
            for n in &names {
                store.update_map::<f32>(n, |x| x + 1.0)?;
            }
            total
        } else {
            // `share` of all chunks, spread evenly over the model.
            let n = (total as f64 * share).round() as usize;
            for k in 0..n {
                let g = k * (total / n);
                let r = store.tensor(&names[g / per])?.chunk_range(g % per);
                store.update_range::<f32>(&names[g / per], r, |_, xs| {
                    xs.iter_mut().for_each(|x| *x += 1.0)
                })?;
            }
            n
        };
        let vb = store.commit("B")?;
        let sb = store.snapshot(vb)?;
        for (n, b) in names.iter().zip(copy_b.iter_mut()) {
            sb.tensor(n)?
                .copy_into(&mut ArrayViewMut2::from_shape((rows, COLS), &mut b[..])?)?;
        }
        eprintln!(
            "  {label:>4} changed: {n_changed} of {total} chunks of {} KiB",
            ce >> 8
        );

        let store = RefCell::new(store);
        let (data, copy_b, names) = (&data, &copy_b, &names);
        let deep_copy = &mut || {
            timed(|| {
                bufs.par_iter_mut()
                    .zip(data.par_iter())
                    .for_each(|(d, s)| d.copy_from_slice(s));
                Ok(black_box(&mut bufs).len())
            })
        };
        let compare = &mut || {
            timed(|| {
                let n: usize = (data.par_iter().zip(copy_b.par_iter()))
                    .map(|(a, b)| {
                        a.chunks(ce)
                            .zip(b.chunks(ce))
                            .filter(|(x, y)| ne(x, y))
                            .count()
                    })
                    .sum();
                assert_eq!(n, n_changed, "baseline compare miscounted");
                Ok(n)
            })
        };
        let commit = &mut || {
            // Untimed: HEAD at A, working state = B's tensors (dirty by `share`).
            let mut s = store.borrow_mut();
            s.restore(va)?;
            for n in names {
                s.remove(n)?;
                s.insert_tensor(n, sb.tensor(n)?.clone())?;
            }
            timed(|| Ok(s.commit("B again")?))
        };
        let restore = &mut || {
            let mut s = store.borrow_mut();
            s.restore(vb)?; // untimed
            timed(|| Ok(s.restore(va)?))
        };
        let undo = &mut || {
            let mut s = store.borrow_mut();
            s.restore(vb)?; // untimed: clean at B, whose parent is A
            let d = timed(|| Ok(s.undo()?))?;
            assert_eq!(s.redo()?, vb); // untimed
            Ok(d)
        };
        let diff = &mut || {
            let s = store.borrow();
            timed(|| {
                let d = s.diff(va, vb)?;
                assert_eq!(d.changed_chunks(), n_changed, "diff miscounted");
                Ok(d)
            })
        };
        let m = interleave(reps, &mut [deep_copy, compare, commit, restore, undo, diff])?;
        let copy = "deep copy into buffers";
        out.push(("commit", label, m[2], copy, m[0]));
        out.push(("restore", label, m[3], copy, m[0]));
        out.push(("undo", label, m[4], copy, m[0]));
        out.push(("diff(a, b)", label, m[5], "compare two deep copies", m[1]));
    }
    // Rows by operation, then by share.
    let order = ["commit", "restore", "undo", "diff(a, b)"];
    out.sort_by_key(|r| order.iter().position(|o| *o == r.0));
    Ok(out)
}

/// Bitwise inequality of two equally long slices (memcmp, as the store compares chunks).
fn ne(x: &[f32], y: &[f32]) -> bool {
    bytemuck::cast_slice::<f32, u8>(x) != bytemuck::cast_slice::<f32, u8>(y)
}

/// Print `rows` under a header line, each column as wide as its widest cell.
fn print_table(title: &str, what: &str, base: [&str; 2], rows: &[Row]) {
    let ratio = format!("{}/store", base[1]);
    let mut cells = vec![[title, what, "store", base[0], base[1], &ratio].map(str::to_owned)];
    for &(op, what, s, base, b) in rows {
        let (s_ms, b_ms, r) = (fmt_ms(s), fmt_ms(b), fmt_ratio(b / s));
        cells.push([op.into(), what.into(), s_ms, base.into(), b_ms, r]);
    }
    let width = |i: usize| cells.iter().map(|r| r[i].chars().count()).max();
    for c in &cells {
        let line: Vec<String> = (0..6)
            .map(|i| {
                let w = width(i).unwrap_or(0);
                match i {
                    2 | 4 | 5 => format!("{:>w$}", c[i]), // numbers right-aligned
                    _ => format!("{:<w$}", c[i]),
                }
            })
            .collect();
        println!("{}", line.join("   "));
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let (mut quick, mut reps) = (false, 9);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--reps" => {
                let v = args.next().and_then(|v| v.parse::<usize>().ok());
                reps = v.ok_or("--reps needs a positive number")?.max(1);
            }
            other => return Err(format!("unknown argument {other}: --quick, --reps N").into()),
        }
    }
    let start = Instant::now();
    let tick: Vec<f64> = (0..1001)
        .map(|_| timed(|| Ok(())).map(|d| d.as_secs_f64() * 1e3))
        .collect::<Res<_>>()?;
    eprintln!(
        "machine: {} cores (available_parallelism), rayon pool of {} threads; timer overhead ~{}; {reps} runs per side, medians",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        rayon::current_num_threads(),
        fmt_ms(median(tick))
    );
    eprintln!("ArrayD::clone is one memcpy on one thread; Store::write compares chunks on rayon");

    let (ra, rb) = [(65_536, 4_096), (16_384, 1_024)][usize::from(quick)];
    let a = part_a(ra, reps)?;
    let b = part_b(rb, reps)?;
    let (ta, tb) = (
        format!("A: {} MiB tensor", ra >> 8),
        format!("B: {} MiB model", rb >> 2),
    );
    print_table(&ta, "store call", ["ndarray baseline", "ndarray"], &a);
    println!();
    print_table(&tb, "changed", ["deep-copy baseline", "baseline"], &b);
    eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}
