//! The repository rows of `bench_report`: saving, opening and disk use of a repository
//! against safetensors files of the same model (the reference `safetensors` crate,
//! every file fsynced, as the store fsyncs its saves).
//!
//! Both sides work on a warm page cache (files just written), and neither prefaults the
//! buffers it reads into: the store's `get` and the baseline's per-tensor vectors are
//! freshly allocated in every run.

use std::borrow::Cow;
use std::fs::File;
use std::hint::black_box;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, View};
use safetensors::SafeTensors;
use tensor_history::{Config, Store};

use super::timing::{timed, Res};
use super::{dense_step, interleave, pick_chunks, Model, Report, TENSORS};

/// The repository rows, in the order the report prints them.
pub const SCENARIOS: [&str; 11] = [
    "save_first_vs_safetensors",
    "save_1pct_vs_safetensors",
    "save_background_call_vs_save_1pct",
    "save_background_call_vs_save_dense",
    "commit_save_loop_vs_commit",
    "commit_save_loop_blocking_vs_background",
    "open_restore_read_vs_load",
    "disk_100v_1pct",
    "heap_8v_dense",
    "disk_dense_10v",
    "save_dense_vs_safetensors",
];

/// One tensor of the model as the safetensors writer sees it.
struct F32View<'a> {
    shape: [usize; 2],
    data: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(bytemuck::cast_slice(self.data))
    }
    fn data_len(&self) -> usize {
        std::mem::size_of_val(self.data)
    }
}

/// The baseline save: `safetensors::serialize_to_file` of the whole model, then the
/// file and its directory fsynced (the crate renames a temporary file into place but
/// syncs nothing).
fn safetensors_save(model: &Model, path: &Path) -> Res<()> {
    let views = (0..TENSORS).map(|t| {
        (
            model.names[t].as_str(),
            F32View {
                shape: [model.rows, super::COLS],
                data: &model.data[t],
            },
        )
    });
    safetensors::serialize_to_file(views, None, path)?;
    File::open(path)?.sync_all()?;
    File::open(path.parent().ok_or("no parent directory")?)?.sync_all()?;
    Ok(())
}

/// The baseline load: map the file, parse it, and copy every tensor into its own vector.
fn safetensors_load(path: &Path) -> Res<Vec<Vec<f32>>> {
    let file = File::open(path)?;
    // SAFETY: the file is this benchmark's own, in its private temporary directory, and
    // nothing writes to it while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    let st = SafeTensors::deserialize(&map)?;
    Ok(st
        .iter()
        .map(|(_, view)| {
            let mut v = vec![0f32; view.data().len() / 4];
            bytemuck::cast_slice_mut::<f32, u8>(&mut v).copy_from_slice(view.data());
            v
        })
        .collect())
}

/// Bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> Res<u64> {
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let meta = e.metadata()?;
            if meta.is_dir() {
                todo.push(e.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

fn files_under(dir: &Path) -> Res<usize> {
    let mut n = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                todo.push(e.path());
            } else {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Add 1.0 to `share` of the store's chunks (chosen by `salt`) and commit.
fn change_and_commit(store: &mut Store, model: &Model, share: f64, salt: usize) -> Res<()> {
    for (t, r) in pick_chunks(store, model, share, salt)? {
        store.update_range::<f32>(&model.names[t], r, |_, xs| {
            xs.iter_mut().for_each(|x| *x += 1.0)
        })?;
    }
    store.commit(&format!("change {salt}"))?;
    Ok(())
}

/// Run the repository scenarios in `root` (a directory that is removed at the end).
pub fn run(
    model: &Model,
    cfg: &dyn Fn(Option<usize>) -> Config,
    reps: usize,
    root: &Path,
    report: &mut Report,
) -> Res<()> {
    std::fs::create_dir_all(root)?;
    let st_path = root.join("model.safetensors");
    let size = model.bytes();

    // ---- save_first_vs_safetensors: first save of the model vs one safetensors file --
    // The same store saves into a new directory every run: each is a first save.
    let mut store = model.store(cfg(None))?;
    let v0 = store.commit("init")?;
    store.tag("first", v0)?;
    let mut n = 0usize;
    let mut last: Option<PathBuf> = None;
    {
        let mut base = || timed(|| safetensors_save(model, &st_path));
        let mut st = || {
            n += 1;
            let dir = root.join(format!("repo{n}"));
            let t = timed(|| Ok(store.save_as(&dir)?))?;
            if let Some(old) = last.replace(dir) {
                std::fs::remove_dir_all(old)?;
            }
            Ok(t)
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("save_first_vs_safetensors", "ms", m[0], m[1]);
    }
    let repo_dir = last.clone().ok_or("no save ran")?;
    eprintln!(
        "  repository after the first save: {} files, {} bytes; safetensors file {} bytes",
        files_under(&repo_dir)?,
        disk_bytes(&repo_dir)?,
        std::fs::metadata(&st_path)?.len()
    );

    // ---- save_1pct_vs_safetensors: 1% of chunks changed and committed, then save ------
    // The change and the commit are not timed; the baseline writes the full file again.
    {
        let mut salt = 0;
        let mut base = || timed(|| safetensors_save(model, &st_path));
        let mut st = || {
            salt += 1;
            change_and_commit(&mut store, model, 0.01, salt)?;
            timed(|| Ok(store.save()?))
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("save_1pct_vs_safetensors", "ms", m[0], m[1]);
    }

    // ---- save_background_call_vs_save_*: the time save() takes vs the time
    // save_in_background() blocks the caller, after the same change (1% of chunks, or
    // every chunk). Changes, commits and the wait for the background save are not timed;
    // the background call includes taking back the previous save's result.
    // Every dense run writes the whole model again: at most 5 runs per side keep the
    // repository within 12 model sizes.
    for (row, share, runs) in [
        ("save_background_call_vs_save_1pct", 0.01, reps),
        ("save_background_call_vs_save_dense", 1.0, reps.min(5)),
    ] {
        let mut salt = 1000;
        let mut change = |store: &mut Store| -> Res<()> {
            salt += 1;
            if share >= 1.0 {
                for name in &model.names {
                    store.update_map::<f32>(name, |x| x + 1.0)?;
                }
                store.commit(&format!("dense {salt}"))?;
                Ok(())
            } else {
                change_and_commit(store, model, share, salt)
            }
        };
        let cell = std::cell::RefCell::new((&mut store, &mut change));
        let mut base = || {
            let (s, c) = &mut *cell.borrow_mut();
            c(s)?;
            timed(|| Ok(s.save()?))
        };
        let mut bg = || {
            let (s, c) = &mut *cell.borrow_mut();
            c(s)?;
            let mut pending = None;
            let t = timed(|| {
                pending = Some(s.save_in_background()?);
                Ok(())
            })?;
            pending.ok_or("no save started")?.wait()?;
            Ok(t)
        };
        let m = interleave(runs, &mut [&mut base, &mut bg])?;
        report.add(row, "ms", m[0], m[1]);
    }

    // ---- commit_save_loop_vs_commit: 16 steps of (1% of chunks changed, commit), with
    // a background save after every commit vs without saving. The loop's time is what
    // the caller feels; the wait for the last save after the loop is not timed.
    // commit_save_loop_blocking_vs_background: the same loop with a blocking save()
    // after every commit vs with a background save (the three loops interleaved).
    {
        const STEPS: usize = 16;
        let cell = std::cell::RefCell::new((&mut store, 2000usize));
        let mut base = || {
            let (s, salt) = &mut *cell.borrow_mut();
            let t = timed(|| {
                for _ in 0..STEPS {
                    *salt += 1;
                    change_and_commit(s, model, 0.01, *salt)?;
                }
                Ok(())
            })?;
            s.save()?;
            Ok(t)
        };
        let mut bg = || {
            let (s, salt) = &mut *cell.borrow_mut();
            let mut last = None;
            let t = timed(|| {
                for _ in 0..STEPS {
                    *salt += 1;
                    change_and_commit(s, model, 0.01, *salt)?;
                    last = Some(s.save_in_background()?);
                }
                Ok(())
            })?;
            last.ok_or("no save started")?.wait()?;
            Ok(t)
        };
        let mut blocking = || {
            let (s, salt) = &mut *cell.borrow_mut();
            timed(|| {
                for _ in 0..STEPS {
                    *salt += 1;
                    change_and_commit(s, model, 0.01, *salt)?;
                    s.save()?;
                }
                Ok(())
            })
        };
        let m = interleave(reps, &mut [&mut base, &mut bg, &mut blocking])?;
        report.add("commit_save_loop_vs_commit", "ms", m[0], m[1]);
        report.add("commit_save_loop_blocking_vs_background", "ms", m[2], m[1]);
    }
    drop(store);

    // ---- open_restore_read_vs_load: open, restore the first version, read a tensor ---
    {
        let name = &model.names[0];
        let mut base = || {
            timed(|| {
                let tensors = safetensors_load(&st_path)?;
                assert_eq!(tensors.len(), TENSORS);
                Ok(tensors)
            })
        };
        let mut st = || {
            timed(|| {
                let mut s = Store::open(&repo_dir)?;
                let first = s.resolve("first")?;
                s.restore(first)?;
                let a = s.get::<f32>(name)?;
                assert_eq!(a.len(), model.data[0].len());
                Ok((s, a))
            })
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("open_restore_read_vs_load", "ms", m[0], m[1]);
    }
    std::fs::remove_dir_all(&repo_dir)?;

    // ---- disk_100v_1pct: 100 versions, each changing 1% of chunks, each saved ---------
    // Baseline: 100 safetensors files of the model (the size of one file, times 100).
    {
        let dir = root.join("repo_100v");
        let mut store = model.store(cfg(None))?;
        store.commit("v0")?;
        store.save_as(&dir)?;
        for k in 1..100 {
            change_and_commit(&mut store, model, 0.01, k)?;
            store.save()?;
        }
        let repo_bytes = disk_bytes(&dir)?;
        let file_bytes = std::fs::metadata(&st_path)?.len();
        eprintln!(
            "  disk: {} versions in {} files, {repo_bytes} bytes; one safetensors file {file_bytes} bytes",
            store.versions().len(),
            files_under(&dir)?
        );
        report.add(
            "disk_100v_1pct",
            "bytes",
            (100 * file_bytes) as f64,
            repo_bytes as f64,
        );
        drop(store);
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::remove_file(&st_path)?;

    // ---- heap_8v_dense: heap held by 8 dense versions and the working state, before and
    // after a save (chunks held only by saved versions leave the heap) -----------------
    {
        let dir = root.join("repo_dense");
        let mut store = model.store(cfg(None))?;
        store.commit("v0")?;
        for k in 1..8 {
            for name in &model.names {
                store.update_map::<f32>(name, |x| x + 1.0)?;
            }
            store.commit(&format!("dense {k}"))?;
        }
        for name in &model.names {
            store.update_map::<f32>(name, |x| x + 1.0)?;
        }
        let before = store.stats();
        let held_before = before.heap_bytes + before.pooled_bytes;
        store.save_as(&dir)?;
        let after = store.stats();
        let held_after = after.heap_bytes + after.pooled_bytes;
        eprintln!(
            "  heap: before save {} heap + {} pooled bytes ({} versions, model {size} bytes); \
             after save {} heap + {} pooled, {} stored",
            before.heap_bytes,
            before.pooled_bytes,
            before.versions,
            after.heap_bytes,
            after.pooled_bytes,
            after.stored_bytes
        );
        report.add(
            "heap_8v_dense",
            "bytes",
            held_before as f64,
            held_after as f64,
        );
        black_box(&store);
        drop(store);
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}

/// The dense rows on disk, in `root` (removed at the end): `dense` is the model of
/// `memory_dense_100v` (pseudo-random weights), each checkpoint one dense step of it
/// (every element changed by up to a relative 1e-4, as [`dense_step`] does).
///
/// - `disk_dense_10v`: 10 checkpoints (the first and 9 steps) saved one by one into a
///   repository: their raw bytes / the repository's bytes on disk.
/// - `save_dense_vs_safetensors`: then one more dense step, committed (not timed), and
///   its save, against one safetensors file of the model with fsync.
pub fn dense(
    dense: &Model,
    cfg: &dyn Fn(Option<usize>) -> Config,
    reps: usize,
    root: &Path,
    report: &mut Report,
) -> Res<()> {
    std::fs::create_dir_all(root)?;
    let dir = root.join("repo_dense_10v");
    let st_path = root.join("dense.safetensors");
    let dsize = dense.bytes();
    let mut store = dense.store(cfg(None))?;
    dense_step(&mut store, dense, 0)?;
    store.commit("checkpoint 0")?;
    store.save_as(&dir)?;
    for step in 1..10 {
        dense_step(&mut store, dense, step)?;
        store.commit(&format!("checkpoint {step}"))?;
        store.save()?;
    }
    let repo_bytes = disk_bytes(&dir)?;
    eprintln!(
        "  disk_dense_10v: 10 checkpoints of {dsize} bytes in {} files, {repo_bytes} bytes",
        files_under(&dir)?
    );
    report.add(
        "disk_dense_10v",
        "bytes",
        (10 * dsize) as f64,
        repo_bytes as f64,
    );
    let mut step = 10;
    {
        let mut base = || timed(|| safetensors_save(dense, &st_path));
        let mut st = || {
            dense_step(&mut store, dense, step)?;
            store.commit(&format!("checkpoint {step}"))?;
            step += 1;
            timed(|| Ok(store.save()?))
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("save_dense_vs_safetensors", "ms", m[0], m[1]);
    }
    drop(store);
    std::fs::remove_dir_all(root)?;
    Ok(())
}
