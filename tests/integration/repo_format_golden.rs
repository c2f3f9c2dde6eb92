//! The objects of format version 4 this build writes are byte for byte the ones
//! every earlier build of that version wrote: the pack and the index file of a fixed
//! history are pinned here by the BLAKE3 of their bytes (version objects hold the
//! commit time and the repository's config a random id, so they are not pinned). The
//! pack holds the history's chunks and its three manifests, whose ids (and so the
//! versions' content addresses) are those of formats 1 to 3, where each manifest was an
//! object of its own (`manifests/78/78cf...`, `cb/cbf3...`, `d1/d101...`); format 3
//! wrote the same chunks in a pack of envelope version 3, format 2 differed from it only
//! in the envelope version of the pack and the index (this history has no delta).
//! `repo_format_fixtures` keeps a repository of each of formats 1, 2 and 3.

use crate::common;

use std::sync::Arc;

use tensor_history::{Backend, MemoryBackend};

#[test]
fn packs_indexes_and_manifests_are_written_byte_for_byte_as_format_4_specifies() {
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
            "index/534efcfa5426d83016ddf9770491e62efbf6fead6e7e4a3106b917afe35c5289.thidx",
            "9715ea1a67eb15f2a080f53d31cc14924389799acb957d8d7cf0edf67f52f00d",
        ),
        (
            "packs/5c/5c19c4eea4807da6db5702a31fb7d8f194a8d48a8c23b392232fad120dd9256f.thpack",
            "a881c4ec112fc8f13138673f843fe9c956b6f50917f8d1bdceacd2e0716ff5b8",
        ),
    ];
    let found: Vec<(&str, &str)> = found
        .iter()
        .map(|(k, h)| (k.as_str(), h.as_str()))
        .collect();
    assert_eq!(found, want);
    // The pack's footer lists the manifests by their ids, as formats 1 to 3 named their
    // objects.
    let pack = backend.get(want[1].0).unwrap();
    for id in [
        "78cfaaf5550964d7a33143d37919ed3a6dfad6dca6f61dd237957f09c72ec160",
        "cbf31f82a5a9d4962ed44827f6b28c6b43fee585e961f8546880f499dd1d22dd",
        "d1017237682d6a0ead473c53f35b782a58a533821145ee5d59e980792064fbab",
    ] {
        let id: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&id[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert!(pack.windows(32).any(|w| w == &id[..]), "manifest {id:02x?}");
    }
}
