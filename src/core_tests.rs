//! Small unit tests of chunks and tensors: the buffer pool, copy-on-write, fused
//! updates with both kinds of stores, and views of non-contiguous arrays. Sizes are tiny
//! so that CI also runs them under Miri (`cargo +nightly miri test --lib`), which checks
//! the bytemuck casts, the pool's buffer reuse and the streaming kernels underneath.

use ndarray::{s, Array2};

use crate::chunk::{Alloc, Pool};
use crate::element::DType;
use crate::kernels::WriteMode;
use crate::tensor::{Tensor, WriteCtx};

fn ctx(alloc: &Alloc, mode: WriteMode) -> WriteCtx {
    WriteCtx {
        alloc: alloc.clone(),
        mode,
        par_min_bytes: usize::MAX,
    }
}

#[test]
fn freed_buffers_return_to_the_pool_and_are_reused() {
    let pool = Pool::new(64, 256);
    let alloc = Alloc::new(Some(pool.clone()));
    let c = alloc.chunk_from_bytes(&[7u8; 60]);
    assert_eq!((c.len_bytes(), c.held_bytes()), (60, 64));
    drop(c);
    assert_eq!(pool.pooled_bytes(), 64);
    let d = alloc.chunk_from_bytes(&[1u8; 64]);
    assert_eq!(pool.pooled_bytes(), 0);
    assert_eq!(d.data(), &[1u8; 64][..]);
    // A short buffer does not come from the pool, nor goes back to it.
    drop(alloc.chunk_from_bytes(&[2u8; 8]));
    assert_eq!(pool.pooled_bytes(), 0);
    pool.clear();
}

#[test]
fn fused_updates_copy_shared_chunks_and_write_owned_ones_in_place() {
    for mode in [WriteMode::Normal, WriteMode::Streaming] {
        let alloc = Alloc::new(Some(Pool::new(48, 1024)));
        let a = Array2::from_shape_fn((5, 3), |(i, j)| (i * 3 + j) as f32);
        let mut t = Tensor::from_array_in(&a, 48, &alloc).unwrap();
        let base = t.clone();
        let cx = ctx(&alloc, mode);
        assert_eq!(t.map::<f32>(&cx, |x| x), (0, 0));
        assert!(t.ptr_eq(&base));
        let (written, copied) = t.map::<f32>(&cx, |x| x + 1.0);
        assert_eq!((written, copied), (2, 60));
        assert_eq!(t.shared_chunks(&base), 0);
        let g = [1.0f32; 15];
        assert_eq!(t.zip::<f32>(&g, &cx, |x, g| x - g), (2, 0));
        assert_eq!(t.to_array::<f32>().unwrap(), a.clone().into_dyn());
        let stats = t.write_from::<f32>(&[0.5; 15], &cx);
        assert_eq!(stats.chunks_changed, 2);
        assert!(base.to_array::<f32>().unwrap() == a.clone().into_dyn());
    }
}

#[test]
fn update_range_touches_only_the_chunks_in_range() {
    let alloc = Alloc::default();
    let a = Array2::from_shape_fn((4, 4), |(i, j)| (i * 4 + j) as u16);
    let mut t = Tensor::from_array_in(&a, 8, &alloc).unwrap(); // one row per chunk
    let base = t.clone();
    let (written, copied) = t.update_range::<u16>(5..7, &alloc, |off, xs| {
        assert_eq!((off, xs.len()), (5, 2));
        xs.iter_mut().for_each(|x| *x += 100);
    });
    assert_eq!((written, copied), (1, 8));
    assert_eq!(t.shared_chunks(&base), 3);
    let out = t.to_array::<u16>().unwrap();
    assert_eq!((out[[1, 1]], out[[1, 3]], out[[2, 1]]), (105, 7, 9));
}

#[test]
fn tensors_of_strided_views_hold_the_logical_order() {
    let a = Array2::from_shape_fn((4, 6), |(i, j)| (i * 10 + j) as i64);
    let view = a.slice(s![..;2, 1..;2]);
    let t = Tensor::from_array(&view, 24).unwrap(); // one row of 3 i64 per chunk
    assert_eq!(t.to_array::<i64>().unwrap(), view.to_owned().into_dyn());
    let rows: Vec<_> = t.row_blocks::<i64>().unwrap().map(|(r, _)| r).collect();
    assert_eq!(rows, vec![0..1, 1..2]);
    let mut out = Array2::<i64>::zeros((3, 2)).reversed_axes();
    t.copy_into(&mut out).unwrap();
    assert_eq!(out, view.to_owned());
}

#[test]
fn every_dtype_tag_names_its_dtype_and_no_other_tag_does() {
    for (i, d) in DType::ALL.into_iter().enumerate() {
        assert_eq!(
            usize::from(d.tag()),
            i,
            "{d} is not at its tag in DType::ALL"
        );
        assert_eq!(DType::from_tag(d.tag()), Some(d));
    }
    for tag in DType::ALL.len()..=usize::from(u8::MAX) {
        assert_eq!(DType::from_tag(u8::try_from(tag).unwrap()), None);
    }
}
