//! The objects of format version 2 this build writes are byte for byte the ones
//! every earlier build of that version wrote: packs, index files and manifests of a
//! fixed history are pinned here by the BLAKE3 of their bytes (version objects hold the
//! commit time and the repository's config a random id, so they are not pinned).
//! Manifests are the same as in format 1 (their envelope stays version 1, so versions
//! keep their content addresses); `repo_format_fixtures` keeps a format-1 and a format-2 repository.

mod common;

use std::sync::Arc;

use tensor_history::{Backend, MemoryBackend};

#[test]
fn packs_indexes_and_manifests_are_written_byte_for_byte_as_format_2_specifies() {
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
            "index/f1545f4e9ebdfe88f521a3e2d6bb4bea06460777ed52c4dc096504dfd09296e4.thidx",
            "2512e45ed671725655d1dbb7f9199d19ea2e231ba18c7fc896404e0e5e601760",
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
            "packs/a0/a05b696daaa6e73ea501d0a7f76293b187352b66c104f15fff70de1919b6f77c.thpack",
            "66a6c925c4db6d2556f5455aaf9498ccb42537ef9e341200dcb746eaac3fe0c7",
        ),
    ];
    let found: Vec<(&str, &str)> = found
        .iter()
        .map(|(k, h)| (k.as_str(), h.as_str()))
        .collect();
    assert_eq!(found, want);
}
