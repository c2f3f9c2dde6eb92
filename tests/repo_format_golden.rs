//! The objects of format version 1 this build writes are byte for byte the ones every
//! earlier build wrote: packs, index files and manifests of a fixed history are pinned
//! here by the BLAKE3 of their bytes (version objects hold the commit time and the
//! repository's config a random id, so they are not pinned).

mod common;

use std::sync::Arc;

use tensor_history::{Backend, MemoryBackend};

#[test]
fn packs_indexes_and_manifests_are_written_byte_for_byte_as_format_1_specifies() {
    let (mut store, _, _) = common::init_and_double();
    let backend = Arc::new(MemoryBackend::new());
    store.save_to(backend.clone()).unwrap();
    let mut found: Vec<(String, String)> = Vec::new();
    for prefix in ["packs/", "index/", "manifests/"] {
        for o in backend.list(prefix).unwrap() {
            let bytes = backend.get(&o.key).unwrap();
            found.push((o.key.clone(), blake3::hash(&bytes).to_hex().to_string()));
        }
    }
    found.sort();
    let want: &[(&str, &str)] = &[
        (
            "index/7019c4b36849c7e37807e449c8579c570460d8091b8022e7dc069040fda1ef66.thidx",
            "bd9dfd181b504d6790f09af44d3d178883b28d8fe14e220bc9f1828bfe032dad",
        ),
        (
            "manifests/78/78cfaaf5550964d7a33143d37919ed3a6dfad6dca6f61dd237957f09c72ec160.thman",
            "09221fc6edf74a9fb92072163c3f499e026077751c182b5359e12b4143dc2081",
        ),
        (
            "manifests/cb/cbf31f82a5a9d4962ed44827f6b28c6b43fee585e961f8546880f499dd1d22dd.thman",
            "8471a4a10a2f12192210063fb9875bc9bcf00900bb2ade1f486d6a45872a3800",
        ),
        (
            "manifests/d1/d1017237682d6a0ead473c53f35b782a58a533821145ee5d59e980792064fbab.thman",
            "6c436d95fedfcbefc7115688b2d2cbfecbcc25bea81831eb5e0b3bb55b1f3564",
        ),
        (
            "packs/47/47e2c178d8cd3f7aab088881191e8d8fa94df46a8820d062c06b89783f215329.thpack",
            "81ecac0841f21ed255f21a88662a994cd626c8e2ad1a21829219d8e3e95170ce",
        ),
    ];
    let found: Vec<(&str, &str)> = found
        .iter()
        .map(|(k, h)| (k.as_str(), h.as_str()))
        .collect();
    assert_eq!(found, want);
}
