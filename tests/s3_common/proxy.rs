//! A TCP proxy on loopback between a client and an S3 server that a test can stop (every
//! connection cut, new ones refused), cut after a number of uploaded bytes, and restart
//! on the same port: "the server went away" while the server keeps its objects.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Default)]
struct State {
    running: AtomicBool,
    /// Client-to-server bytes forwarded since start.
    bytes_up: AtomicU64,
    /// Stop once `bytes_up` reaches this.
    cut_at: AtomicU64,
    conns: Mutex<Vec<TcpStream>>,
}

impl State {
    fn kill_all(&self) {
        self.running.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// See the module docs. Stops on drop.
pub struct Proxy {
    port: u16,
    upstream: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free loopback port forwarding to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Proxy {
        let upstream: SocketAddr = upstream.parse().expect("upstream host:port");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        let mut p = Proxy {
            port,
            upstream,
            state: Arc::new(State::default()),
            accept: None,
        };
        p.serve(listener);
        p
    }

    /// The proxy for the server named by `AWS_ENDPOINT_URL` (`http://host:port`).
    pub fn for_env_endpoint() -> Proxy {
        Proxy::for_endpoint(&std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL"))
    }

    /// The proxy for the server at `endpoint` (`http://host:port`, maybe with a path).
    pub fn for_endpoint(endpoint: &str) -> Proxy {
        let hostport = endpoint
            .strip_prefix("http://")
            .expect("an http:// test endpoint")
            .split('/')
            .next()
            .unwrap();
        Proxy::start(hostport)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `endpoint` (`http://host:port/path`) with the proxy in place of the server: the
    /// same path on `http://127.0.0.1:<port>`.
    pub fn endpoint_like(&self, endpoint: &str) -> String {
        let rest = endpoint.strip_prefix("http://").unwrap_or(endpoint);
        match rest.split_once('/') {
            Some((_, path)) => format!("{}/{path}", self.endpoint()),
            None => self.endpoint(),
        }
    }

    /// Client-to-server bytes forwarded so far.
    pub fn bytes_up(&self) -> u64 {
        self.state.bytes_up.load(Ordering::SeqCst)
    }

    /// Stop (as [`stop`](Proxy::stop)) as soon as `n` more bytes have gone up.
    pub fn cut_after(&self, n: u64) {
        self.state
            .cut_at
            .store(self.bytes_up().saturating_add(n), Ordering::SeqCst);
    }

    /// Whether the proxy is serving.
    pub fn is_running(&self) -> bool {
        self.state.running.load(Ordering::SeqCst)
    }

    /// Cut every connection and refuse new ones.
    pub fn stop(&mut self) {
        self.state.kill_all();
        if let Some(h) = self.accept.take() {
            h.join().unwrap();
        }
    }

    /// Serve again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.state.cut_at.store(u64::MAX, Ordering::SeqCst);
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => break l,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("rebind port {}: {e}", self.port),
            }
        };
        self.serve(listener);
    }

    fn serve(&mut self, listener: TcpListener) {
        listener.set_nonblocking(true).unwrap();
        self.state.running.store(true, Ordering::SeqCst);
        self.state.cut_at.store(u64::MAX, Ordering::SeqCst);
        let state = Arc::clone(&self.state);
        let upstream = self.upstream;
        self.accept = Some(std::thread::spawn(move || {
            while state.running.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(upstream) else {
                            continue;
                        };
                        {
                            let mut conns = state.conns.lock().unwrap();
                            conns.push(client.try_clone().unwrap());
                            conns.push(server.try_clone().unwrap());
                        }
                        pump(
                            client.try_clone().unwrap(),
                            server.try_clone().unwrap(),
                            &state,
                            true,
                        );
                        pump(server, client, &state, false);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(_) => break,
                }
            }
            // The listener drops here: new connections are refused.
        }));
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, state: &Arc<State>, up: bool) {
    let state = Arc::clone(state);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if up {
                let total = state.bytes_up.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
                if total >= state.cut_at.load(Ordering::SeqCst) {
                    state.kill_all();
                    break;
                }
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}
