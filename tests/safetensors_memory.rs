//! Export streams: no allocation grows with the model. A counting allocator records the
//! largest single allocation made on the exporting thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ndarray::Array2;
use tensor_history::Store;

struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = TRACKING.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

// SAFETY: every call is forwarded to `System` unchanged; the counting touches only
// const-initialized thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on as it is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract for `realloc` is passed on as it is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: usize = 1 << 20;

#[test]
fn export_of_a_64_mib_version_allocates_no_buffer_near_the_model_size() {
    let mut store = Store::new();
    for i in 0..4 {
        let a = Array2::<f32>::from_elem((1024, 4096), i as f32);
        store.insert(&format!("layer{i}"), &a).unwrap();
    }
    let v = store.commit("64 MiB").unwrap();
    assert_eq!(store.snapshot(v).unwrap().nbytes(), 64 * MIB);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");

    TRACKING.with(|t| t.set(true));
    let result = store.export_safetensors(v, &path);
    TRACKING.with(|t| t.set(false));
    result.unwrap();

    let largest = LARGEST.with(Cell::get);
    assert!(largest >= MIB, "the 1 MiB write buffer was seen: {largest}");
    assert!(largest <= 2 * MIB, "largest allocation {largest} bytes");
    let bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(bytes.len(), 8 + header + 64 * MIB);
}
