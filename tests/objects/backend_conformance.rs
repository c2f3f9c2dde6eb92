//! One suite of behaviours every storage backend keeps (the contract in
//! `tensor_history::Backend`'s docs), run on each backend this build has: memory, a local
//! directory and the power-loss simulator in every build (plain `cargo test`), and with
//! feature `s3` an object store in memory behind `ObjectStoreBackend` and a real S3
//! server when one is configured.
//!
//! S3 runs need `TH_S3_BUCKET` and the `AWS_*` variables (`.ci/s3-server.sh` sets them).
//! With `TH_S3_REQUIRED=1` (set by `.ci/run`) a missing server fails the tests instead of
//! skipping the S3 cases.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::sync::{Arc, Barrier};

use tensor_history::{is_not_found, Backend, Error, PutOutcome};

use crate::s3_common as common;

fn kind(e: &Error) -> Option<ErrorKind> {
    match e {
        Error::Io { kind, .. } => Some(*kind),
        _ => None,
    }
}

/// Deterministic bytes that differ with `seed`.
fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Run `check` on every backend of this build, naming the backend on failure.
fn on_every_backend(check: impl Fn(&dyn Backend)) {
    let (backends, _dir) = common::backends();
    let names: Vec<&str> = backends.iter().map(|(n, _)| *n).collect();
    for always in ["memory", "local directory", "power-loss simulator"] {
        assert!(names.contains(&always), "{always} is not tested: {names:?}");
    }
    for (name, b) in backends {
        eprintln!("backend: {name} at {}", b.location());
        check(b.as_ref());
    }
}

#[test]
fn missing_object_is_not_found() {
    on_every_backend(|b| {
        let e = b.get("packs/aa/nothing").unwrap_err();
        assert!(is_not_found(&e), "{e}");
        let e = b.get_range("packs/aa/nothing", 0..4).unwrap_err();
        assert!(is_not_found(&e), "{e}");
    });
}

#[test]
fn put_then_get_returns_the_bytes_and_put_replaces() {
    on_every_backend(|b| {
        for (i, len) in [0usize, 1, 7, 8, 4095, 4096, 65_537]
            .into_iter()
            .enumerate()
        {
            let key = format!("obj/{i}");
            let d = data(len, i as u8);
            b.put(&key, &d).unwrap();
            assert_eq!(&*b.get(&key).unwrap(), &d[..], "len {len}");
        }
        b.put("obj/0", b"second").unwrap();
        assert_eq!(&*b.get("obj/0").unwrap(), b"second");
        b.barrier().unwrap();
    });
}

#[test]
fn get_range_reads_exactly_the_range_and_refuses_past_the_end() {
    on_every_backend(|b| {
        let d = data(10_000, 3);
        b.put("r/x", &d).unwrap();
        for r in [0..1u64, 0..10_000, 9_999..10_000, 123..4_567, 5_000..5_000] {
            let got = b.get_range("r/x", r.clone()).unwrap();
            assert_eq!(&*got, &d[r.start as usize..r.end as usize], "{r:?}");
        }
        for r in [9_000..10_001u64, 10_000..10_001, 20_000..20_010] {
            let e = b.get_range("r/x", r.clone()).unwrap_err();
            assert_eq!(kind(&e), Some(ErrorKind::UnexpectedEof), "{r:?}: {e}");
        }
    });
}

#[test]
fn put_if_absent_creates_once_and_keeps_the_first_bytes() {
    on_every_backend(|b| {
        assert_eq!(
            b.put_if_absent("refs/heads/main/1", b"first").unwrap(),
            PutOutcome::Created
        );
        assert_eq!(
            b.put_if_absent("refs/heads/main/1", b"second").unwrap(),
            PutOutcome::AlreadyExists
        );
        assert_eq!(&*b.get("refs/heads/main/1").unwrap(), b"first");
        // Over an object written by a plain put, too.
        b.put("refs/heads/main/2", b"plain").unwrap();
        assert_eq!(
            b.put_if_absent("refs/heads/main/2", b"other").unwrap(),
            PutOutcome::AlreadyExists
        );
        assert_eq!(&*b.get("refs/heads/main/2").unwrap(), b"plain");
    });
}

#[test]
fn concurrent_put_if_absent_has_exactly_one_winner_per_key() {
    on_every_backend(|b| {
        const WRITERS: usize = 16;
        const ROUNDS: usize = 4;
        for round in 0..ROUNDS {
            let key = format!("race/{round}");
            let barrier = Barrier::new(WRITERS);
            let outcomes: Vec<(usize, PutOutcome)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..WRITERS)
                    .map(|w| {
                        let (key, barrier) = (&key, &barrier);
                        s.spawn(move || {
                            barrier.wait();
                            let body = format!("writer {w}");
                            (w, b.put_if_absent(key, body.as_bytes()).unwrap())
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let winners: Vec<usize> = outcomes
                .iter()
                .filter(|(_, o)| *o == PutOutcome::Created)
                .map(|(w, _)| *w)
                .collect();
            assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
            let stored = b.get(&key).unwrap();
            assert_eq!(&*stored, format!("writer {}", winners[0]).as_bytes());
        }
    });
}

#[test]
fn list_returns_every_key_under_a_string_prefix_with_sizes() {
    on_every_backend(|b| {
        let keys = [
            "refs/heads/main/00001.json",
            "refs/heads/main/00002.json",
            "refs/heads/mainline/00001.json",
            "refs/heads/other/00001.json",
            "refs/tags/v1.json",
            "packs/ab/abc.thpack",
        ];
        for (i, k) in keys.iter().enumerate() {
            b.put(k, &data(10 + i, 0)).unwrap();
        }
        let listed = |p: &str| -> BTreeSet<(String, u64)> {
            b.list(p)
                .unwrap()
                .into_iter()
                .map(|o| (o.key, o.size))
                .collect()
        };
        let expect = |p: &str| -> BTreeSet<(String, u64)> {
            keys.iter()
                .enumerate()
                .filter(|(_, k)| k.starts_with(p))
                .map(|(i, k)| ((*k).to_owned(), 10 + i as u64))
                .collect()
        };
        for p in [
            "",
            "refs/",
            "refs/heads/",
            "refs/heads/main/",
            "refs/heads/main",
            "refs/heads/ma",
            "packs/ab/",
            "nothing/",
        ] {
            assert_eq!(listed(p), expect(p), "prefix `{p}`");
        }
    });
}

#[test]
fn delete_removes_and_deleting_a_missing_object_succeeds() {
    on_every_backend(|b| {
        b.put("d/x", b"x").unwrap();
        b.delete("d/x").unwrap();
        assert!(is_not_found(&b.get("d/x").unwrap_err()));
        b.delete("d/x").unwrap();
        b.delete("d/never").unwrap();
        assert!(b.list("d/").unwrap().is_empty());
        // A deleted key can be created again.
        assert_eq!(b.put_if_absent("d/x", b"y").unwrap(), PutOutcome::Created);
    });
}

#[test]
fn large_objects_round_trip_whole_and_by_range() {
    on_every_backend(|b| {
        // Past the multipart threshold of the object-store backends (8 MiB parts).
        let d = data(17 * (1 << 20) + 12_345, 9);
        b.put("packs/big", &d).unwrap();
        assert_eq!(b.get("packs/big").unwrap().len(), d.len());
        assert!(*b.get("packs/big").unwrap() == d[..]);
        let mid = (8 << 20) - 100..(8 << 20) + 100;
        let got = b
            .get_range("packs/big", mid.start as u64..mid.end as u64)
            .unwrap();
        assert_eq!(&*got, &d[mid]);
        let listed = b.list("packs/").unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].size, d.len() as u64);
    });
}

#[test]
fn read_bytes_are_aligned_for_typed_views() {
    on_every_backend(|b| {
        let d = data(4096, 1);
        b.put("a/x", &d).unwrap();
        let whole = b.get("a/x").unwrap();
        assert_eq!(whole.as_ptr() as usize % 8, 0);
        let part = b.get_range("a/x", 64..128).unwrap();
        assert_eq!(part.as_ptr() as usize % 8, 0);
        assert_eq!(&*part, &d[64..128]);
    });
}

#[test]
fn location_names_the_place() {
    on_every_backend(|b| {
        assert!(!b.location().is_empty());
    });
}

#[test]
fn a_shared_backend_serves_many_threads() {
    on_every_backend(|b| {
        std::thread::scope(|s| {
            for t in 0..8u8 {
                s.spawn(move || {
                    for i in 0..8u8 {
                        let key = format!("mt/{t}/{i}");
                        let d = data(1000 + usize::from(i), t);
                        b.put(&key, &d).unwrap();
                        assert_eq!(&*b.get(&key).unwrap(), &d[..]);
                    }
                });
            }
        });
        assert_eq!(b.list("mt/").unwrap().len(), 64);
    });
}

/// Keep the shared-handle type in use so a backend can be passed around as `Arc`.
#[test]
fn backends_are_shareable_handles() {
    fn assert_send_sync<T: Send + Sync + ?Sized>() {}
    assert_send_sync::<dyn Backend>();
    let (backends, _dir) = common::backends();
    let all: Vec<Arc<dyn Backend>> = backends.into_iter().map(|(_, b)| b).collect();
    assert!(!all.is_empty());
}

#[test]
fn put_parts_stores_the_concatenation() {
    on_every_backend(|b| {
        let (x, y) = (data(5 << 20, 1), data((4 << 20) + 3, 2));
        for (i, parts) in [vec![], vec![&b"ab"[..], b"", b"cd"], vec![&x[..], &y[..]]]
            .into_iter()
            .enumerate()
        {
            let key = format!("parts/{i}");
            b.put_parts(&key, &parts).unwrap();
            assert!(*b.get(&key).unwrap() == parts.concat()[..], "case {i}");
        }
    });
}

#[test]
fn put_many_stores_every_object_and_replaces_like_put() {
    on_every_backend(|b| {
        b.put_many(&[]).unwrap();
        b.put("many/3", b"old").unwrap();
        // More objects than an object store sends at once, an empty one, a replaced one,
        // and one past the multipart threshold of the object-store backends (8 MiB).
        let mut objects: Vec<(String, Vec<u8>)> = (0..40u8)
            .map(|i| (format!("many/{i}"), data(usize::from(i) * 97, i)))
            .collect();
        objects.push(("many/big".into(), data((9 << 20) + 7, 40)));
        b.put_many(&objects).unwrap();
        for (key, d) in &objects {
            assert!(*b.get(key).unwrap() == d[..], "{key}");
        }
        assert_eq!(b.list("many/").unwrap().len(), objects.len());
    });
}

#[test]
fn get_many_reads_every_key_in_order_with_each_missing_one_not_found() {
    on_every_backend(|b| {
        assert!(b.get_many(&[]).is_empty());
        let keys: Vec<String> = (0..40u8).map(|i| format!("gm/{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            if i % 3 != 1 {
                b.put(k, &data(i * 13, i as u8)).unwrap();
            }
        }
        let got = b.get_many(&keys);
        assert_eq!(got.len(), keys.len());
        for (i, r) in got.into_iter().enumerate() {
            match r {
                Ok(d) if i % 3 != 1 => assert!(*d == data(i * 13, i as u8)[..], "{i}"),
                Err(e) if i % 3 == 1 => assert!(is_not_found(&e), "{i}: {e}"),
                other => panic!("{i}: {:?}", other.map(|d| d.len())),
            }
        }
    });
}
