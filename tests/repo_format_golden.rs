//! The objects of format version 3 this build writes are byte for byte the ones
//! every earlier build of that version wrote: packs, index files and manifests of a
//! fixed history are pinned here by the BLAKE3 of their bytes (version objects hold the
//! commit time and the repository's config a random id, so they are not pinned). The
//! pins of format 2 differed only in the envelope version of the pack and the index
//! (this history has no delta).
//! Manifests are the same as in format 1 (their envelope stays version 1, so versions
//! keep their content addresses); `repo_format_fixtures` keeps a format-1 and a format-2 repository.

mod common;

use std::sync::Arc;

use tensor_history::{Backend, MemoryBackend};

#[test]
fn packs_indexes_and_manifests_are_written_byte_for_byte_as_format_3_specifies() {
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
            "index/6488450392c6cd138c6a197bb7d5d3e1f56c3a9bed2e1ec4c951c85d5a397d6a.thidx",
            "cb0b8f16c7dd2e52ac31fec00ce4e6a53577180b09c59ff67bbaf09323f66c04",
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
            "packs/ac/ac8e0b0b178833cd236fe9152306f47a714d6fe3e843abb33626caedae3ad2e6.thpack",
            "83f2d4e8c867c0172a4f8dd289edceab4c28c094ee2d125fe4ac50cd5607c833",
        ),
    ];
    let found: Vec<(&str, &str)> = found
        .iter()
        .map(|(k, h)| (k.as_str(), h.as_str()))
        .collect();
    assert_eq!(found, want);
}
