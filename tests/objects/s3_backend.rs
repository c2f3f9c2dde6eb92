//! `ObjectStoreBackend` beyond the shared contract: calls from inside a tokio runtime,
//! a server that goes away (bounded retries, no partial objects, recovery), and the
//! request counts the benchmarks rely on. The network cases run on each provider of the
//! build whose server is configured (`TH_S3_BUCKET` and `AWS_*`, `TH_AZURE_CONTAINER` and
//! `AZURE_*`; see `tests/s3_common`).

#![cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]

use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensor_history::{
    is_not_found, Backend, Error, ObjectStoreBackend, ObjectStoreOptions, PutOutcome,
};

use crate::s3_common;
use crate::s3_common::proxy::Proxy;

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Retries short enough for a test: about 1.5 s of backoff at most per request.
fn quick_retries(endpoint: Option<String>) -> ObjectStoreOptions {
    let mut o = ObjectStoreOptions::default();
    o.max_retries = 3;
    o.initial_backoff = Duration::from_millis(50);
    o.max_backoff = Duration::from_millis(500);
    o.retry_timeout = Duration::from_secs(10);
    o.endpoint = endpoint;
    o
}

fn in_memory() -> ObjectStoreBackend {
    ObjectStoreBackend::from_object_store(
        Arc::new(object_store::memory::InMemory::new()),
        "x",
        "memory://t",
        ObjectStoreOptions::default(),
    )
    .unwrap()
}

fn exercise(b: &dyn Backend) {
    b.put("a/1", b"one").unwrap();
    assert_eq!(&*b.get("a/1").unwrap(), b"one");
    assert_eq!(&*b.get_range("a/1", 1..3).unwrap(), b"ne");
    assert_eq!(b.put_if_absent("a/2", b"two").unwrap(), PutOutcome::Created);
    assert_eq!(b.list("a/").unwrap().len(), 2);
    b.delete("a/1").unwrap();
}

#[test]
fn calls_from_inside_a_tokio_runtime_work_and_drop_cleanly() {
    let mut backends: Vec<Box<dyn Fn() -> ObjectStoreBackend>> = vec![Box::new(in_memory)];
    for (_, url) in s3_common::locations("in-runtime") {
        backends.push(Box::new(move || ObjectStoreBackend::open(&url).unwrap()));
    }
    for make in &backends {
        // A current-thread runtime: the calling thread is the only one driving it.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let b = make();
            exercise(&b);
            drop(b);
        });
        // A multi-threaded one, from inside a spawned task.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let b = Arc::new(make());
        let b2 = Arc::clone(&b);
        rt.block_on(async move {
            tokio::spawn(async move {
                b2.put("m/1", b"in a task").unwrap();
                drop(b2);
            })
            .await
            .unwrap();
        });
        // And outside any runtime, after the last handle inside one was dropped.
        assert_eq!(&*b.get("m/1").unwrap(), b"in a task");
    }
}

#[test]
fn a_stopped_server_fails_within_the_retry_bound_and_works_after_restart() {
    for (tier, url) in s3_common::locations("stopped") {
        eprintln!("{}", tier.name);
        a_stopped_server_fails_on(&tier.endpoint(), &url);
    }
}

fn a_stopped_server_fails_on(endpoint: &str, url: &str) {
    let mut proxy = Proxy::for_endpoint(endpoint);
    let b = ObjectStoreBackend::open_with(url, quick_retries(Some(proxy.endpoint_like(endpoint))))
        .unwrap();
    b.put("k/before", b"kept").unwrap();

    proxy.stop();
    let t = Instant::now();
    let e = b.put("k/during", b"lost?").unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    let e = b.get("k/before").unwrap_err();
    assert!(matches!(e, Error::Io { .. }) && !is_not_found(&e), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "two failing calls took {:?}",
        t.elapsed()
    );

    proxy.restart();
    assert_eq!(&*b.get("k/before").unwrap(), b"kept");
    assert!(is_not_found(&b.get("k/during").unwrap_err()));
    b.put("k/during", b"now").unwrap();
    assert_eq!(&*b.get("k/during").unwrap(), b"now");
}

#[test]
fn a_connection_cut_mid_upload_leaves_no_partial_object() {
    for (tier, url) in s3_common::locations("cut") {
        eprintln!("{}", tier.name);
        a_connection_cut_on(&tier.endpoint(), &url);
    }
}

fn a_connection_cut_on(endpoint: &str, url: &str) {
    let mut proxy = Proxy::for_endpoint(endpoint);
    let b = ObjectStoreBackend::open_with(url, quick_retries(Some(proxy.endpoint_like(endpoint))))
        .unwrap();
    for (name, len) in [("single", 3 << 20), ("multipart", 20 << 20)] {
        let d = data(len, 4);
        let key = format!("packs/{name}");
        proxy.cut_after(1 << 20);
        let e = b.put(&key, &d).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{name}: {e}");
        assert!(!proxy.is_running(), "{name}: the cut happened");
        proxy.restart();
        let e = b.get(&key).unwrap_err();
        assert!(is_not_found(&e), "{name}: a partial object is visible: {e}");
        assert!(b.list("packs/").unwrap().iter().all(|o| o.key != key));
        b.put(&key, &d).unwrap();
        assert!(*b.get(&key).unwrap() == d[..], "{name}");
    }
}

#[test]
fn requests_are_counted_on_the_wire() {
    for (tier, url) in s3_common::locations("counted") {
        // A 17 MiB object in 8 MiB parts: on S3 (and Google Cloud Storage's XML API) 3
        // part PUTs, a POST to create the upload and one to complete it; on Azure 3 block
        // PUTs and a PUT of the block list.
        let multipart = if tier.name == "azure" { (4, 0) } else { (3, 2) };
        requests_are_counted_on(&url, multipart);
    }
}

fn requests_are_counted_on(url: &str, multipart: (u64, u64)) {
    let b = ObjectStoreBackend::open(url).unwrap();
    let s0 = b.stats();
    b.put("c/small", &data(1000, 1)).unwrap();
    let s1 = b.stats().since(&s0);
    assert_eq!((s1.puts, s1.requests()), (1, 1));
    assert!(s1.bytes_sent >= 1000 && s1.bytes_sent < 1100, "{s1:?}");

    let big = data(17 << 20, 2);
    b.put("c/big", &big).unwrap();
    let s2 = b.stats().since(&s0).since(&s1);
    assert_eq!((s2.puts, s2.posts), multipart, "{s2:?}");
    assert!(s2.bytes_sent >= 17 << 20 && s2.bytes_sent < (17 << 20) + 4096);

    let s3 = b.stats();
    assert_eq!(b.get_range("c/big", 100..200).unwrap().len(), 100);
    let s4 = b.stats().since(&s3);
    assert_eq!((s4.gets, s4.requests(), s4.bytes_received), (1, 1, 100));

    // put_many: one PUT per small object, however many go out at once.
    let many: Vec<(String, Vec<u8>)> = (0..20u8)
        .map(|i| (format!("c/many/{i}"), data(500, i)))
        .collect();
    let s7 = b.stats();
    b.put_many(&many).unwrap();
    let s8 = b.stats().since(&s7);
    assert_eq!((s8.puts, s8.requests()), (20, 20), "{s8:?}");
    assert!(s8.bytes_sent >= 20 * 500, "{s8:?}");
    // get_many: one GET per object, the missing one too.
    let mut keys: Vec<String> = many.iter().map(|(k, _)| k.clone()).collect();
    keys.push("c/many/none".into());
    let s9 = b.stats();
    let got = b.get_many(&keys);
    let s10 = b.stats().since(&s9);
    assert_eq!((s10.gets, s10.requests()), (21, 21), "{s10:?}");
    assert_eq!(s10.bytes_received, 20 * 500, "{s10:?}");
    assert!(got[..20]
        .iter()
        .all(|r| r.as_ref().is_ok_and(|d| d.len() == 500)));
    assert!(got[20].as_ref().is_err_and(is_not_found));

    let s5 = b.stats();
    assert_eq!(
        b.put_if_absent("c/small", b"other").unwrap(),
        PutOutcome::AlreadyExists
    );
    let s6 = b.stats().since(&s5);
    assert_eq!(
        (s6.puts, s6.gets),
        (1, 1),
        "conditional PUT, then the read-back"
    );
}

#[test]
fn bad_keys_and_locations_are_typed_errors() {
    let b = in_memory();
    for key in ["", "a/", "a//b", "../x"] {
        let e = b.put(key, b"x").unwrap_err();
        assert!(
            matches!(&e, Error::Io { kind, .. } if *kind == ErrorKind::InvalidInput),
            "`{key}`: {e}"
        );
    }
    // A provider this build lacks is refused too.
    let lacking = [
        ("gs://b/x", cfg!(feature = "gcs")),
        ("az://c/x", cfg!(feature = "azure")),
        ("s3://b/x", cfg!(feature = "s3")),
    ];
    let lacking = lacking.iter().filter(|(_, on)| !on).map(|(url, _)| *url);
    for url in ["s3://", "s3://b/a/../c", "az://c/x//y", "http://host/x"]
        .into_iter()
        .chain(lacking)
    {
        assert!(matches!(
            ObjectStoreBackend::open(url),
            Err(Error::InvalidArgument { .. })
        ));
    }
    let mut o = ObjectStoreOptions::default();
    o.max_concurrent_parts = 0;
    assert!(matches!(
        ObjectStoreBackend::open_with("s3://b/x", o),
        Err(Error::InvalidArgument { .. })
    ));
}
