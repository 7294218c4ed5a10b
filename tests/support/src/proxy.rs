//! A loopback TCP proxy in front of one of the test bed's servers, for what the servers cannot
//! do on their own:
//!
//! - in front of the S3 server ([`Proxy::https`], [`Proxy::recording`], [`Proxy::cutting`]):
//!   speak HTTPS with a certificate from a private CA, and break transfers half way. It records
//!   the head (request line and headers) of every request clients sent, decrypted, so a test
//!   can check what really went over the wire.
//! - in front of any TCP server, the API server included ([`Proxy::tcp`]): bytes pass through
//!   untouched (TLS stays end to end; the API server's certificate is for 127.0.0.1, as is the
//!   proxy), until [`Proxy::partition`] cuts the clients off.
//!
//! [`Proxy::partition`] works with every kind: it cuts the network as a partition does.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;
use tokio::task::JoinSet;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// Which exchanges the proxy breaks, and where: the connection is closed half way through the
/// response of a GET, or half way through the request of any other method.
#[derive(Clone, Debug)]
pub struct Cut {
    /// Requests whose line starts with this method and contains `path_contains` are cut.
    pub method: &'static str,
    pub path_contains: String,
    /// Bytes of the response (GET) or of the request (other methods) that still go through.
    pub after_bytes: usize,
    /// Whether ranged requests (resumes) are cut as well.
    pub ranged_too: bool,
    /// Cuts in all, after which everything goes through.
    pub times: usize,
}

pub struct Proxy {
    /// `http(s)://127.0.0.1:<port>` (`tcp://` for [`Proxy::tcp`]).
    pub endpoint: String,
    /// Where the proxy listens.
    pub address: SocketAddr,
    /// PEM file of the CA that signed the proxy's certificate (HTTPS proxies only).
    pub ca_bundle: Option<PathBuf>,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    upstream: SocketAddr,
    tls: Option<TlsAcceptor>,
    cut: Option<Cut>,
    /// Whether request heads are parsed and recorded (not for opaque streams such as TLS).
    record: bool,
    heads: Mutex<Vec<String>>,
    cuts: AtomicUsize,
    /// Set once by [`Proxy::partition`].
    partitioned: watch::Sender<bool>,
    /// Set by [`Proxy::stop_server`], cleared by [`Proxy::start_server`].
    down: watch::Sender<bool>,
}

/// What the proxy forwards, and how.
struct Mode {
    tls: Option<TlsAcceptor>,
    cut: Option<Cut>,
    record: bool,
    scheme: &'static str,
}

impl Proxy {
    /// HTTPS in front of `upstream_endpoint`, with a certificate for 127.0.0.1 signed by a CA
    /// made for this proxy; the CA's PEM is written to `work/ca.pem`.
    pub async fn https(upstream_endpoint: &str, work: &Path) -> Proxy {
        let (ca_pem, config) = certificates();
        let ca_bundle = work.join("ca.pem");
        std::fs::write(&ca_bundle, ca_pem).expect("writing the CA bundle");
        let mode = Mode {
            tls: Some(TlsAcceptor::from(Arc::new(config))),
            cut: None,
            record: true,
            scheme: "https",
        };
        Proxy::start(upstream_address(upstream_endpoint), mode, Some(ca_bundle)).await
    }

    /// Plain HTTP in front of `upstream_endpoint`, only recording.
    pub async fn recording(upstream_endpoint: &str) -> Proxy {
        Proxy::start(upstream_address(upstream_endpoint), http(None), None).await
    }

    /// Plain HTTP in front of `upstream_endpoint`, breaking the exchanges `cut` describes.
    pub async fn cutting(upstream_endpoint: &str, cut: Cut) -> Proxy {
        Proxy::start(upstream_address(upstream_endpoint), http(Some(cut)), None).await
    }

    /// Any TCP server at `upstream`: bytes pass through as they are, nothing is recorded.
    pub async fn tcp(upstream: SocketAddr) -> Proxy {
        let mode = Mode {
            tls: None,
            cut: None,
            record: false,
            scheme: "tcp",
        };
        Proxy::start(upstream, mode, None).await
    }

    async fn start(upstream: SocketAddr, mode: Mode, ca_bundle: Option<PathBuf>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let address = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared {
            upstream,
            tls: mode.tls,
            cut: mode.cut,
            record: mode.record,
            heads: Mutex::new(Vec::new()),
            cuts: AtomicUsize::new(0),
            partitioned: watch::Sender::new(false),
            down: watch::Sender::new(false),
        });
        let task = tokio::spawn(serve(listener, shared.clone()));
        Proxy {
            endpoint: format!("{}://{address}", mode.scheme),
            address,
            ca_bundle,
            shared,
            task,
        }
    }

    /// Cuts the clients off from the server as a network partition does: from now on nothing
    /// is forwarded either way on any connection, yet none is closed, and new connections are
    /// accepted but never answered. Clients notice by their own timeouts only.
    pub fn partition(&self) {
        self.shared.partitioned.send_replace(true);
    }

    /// Acts as if the server stopped: every connection is closed now, and each new one at once,
    /// until [`Proxy::start_server`]. Clients see their requests fail straight away, as with a
    /// server that is down.
    pub fn stop_server(&self) {
        self.shared.down.send_replace(true);
    }

    /// Forwards again after [`Proxy::stop_server`].
    pub fn start_server(&self) {
        self.shared.down.send_replace(false);
    }

    /// The heads of all requests so far whose request line contains `needle`, in the order they
    /// were sent (`""` for all of them).
    pub fn request_heads(&self, needle: &str) -> Vec<String> {
        let heads = self.shared.heads.lock().expect("heads lock");
        heads
            .iter()
            .filter(|head| {
                head.lines()
                    .next()
                    .is_some_and(|line| line.contains(needle))
            })
            .cloned()
            .collect()
    }

    /// How many exchanges were broken off.
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn http(cut: Option<Cut>) -> Mode {
    Mode {
        tls: None,
        cut,
        record: true,
        scheme: "http",
    }
}

/// `ip:port` of an `http://ip:port` endpoint.
fn upstream_address(endpoint: &str) -> SocketAddr {
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    authority
        .parse()
        .unwrap_or_else(|e| panic!("endpoint {endpoint} is not http://ip:port: {e}"))
}

/// A fresh CA (as PEM) and a server configuration with a certificate for 127.0.0.1 it signed.
pub(crate) fn certificates() -> (String, ServerConfig) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "pgkube test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
        .expect("CA certificate");
    let server_key = KeyPair::generate().expect("server key");
    let server_certificate = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("server params")
        .signed_by(&server_key, &ca)
        .expect("server certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let config = ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(vec![server_certificate.der().clone()], key)
    .expect("server config");
    (ca.pem(), config)
}

/// Accepts connections until the proxy is dropped, which aborts this task and with it (its
/// JoinSet dropped) every connection.
async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        while connections.try_join_next().is_some() {}
        connections.spawn(connection(client, shared.clone()));
    }
}

async fn connection(mut client: TcpStream, shared: Arc<Shared>) {
    if *shared.partitioned.borrow() {
        return hold_silently().await;
    }
    if *shared.down.borrow() {
        return;
    }
    let Ok(server) = TcpStream::connect(shared.upstream).await else {
        return;
    };
    match &shared.tls {
        // A client that rejects the certificate ends the handshake: nothing to forward.
        Some(acceptor) => {
            if let Ok(mut tls) = acceptor.accept(client).await {
                relay(&mut tls, server, &shared).await;
            }
        }
        None => relay(&mut client, server, &shared).await,
    }
}

/// Forwards until either side closes; once the proxy is partitioned, drops the server side and
/// keeps the client's connection open without a byte more.
async fn relay<C>(client: &mut C, server: TcpStream, shared: &Shared)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let mut partitioned = shared.partitioned.subscribe();
    let partition = async {
        // The sender lives as long as the proxy: an error means it is going away.
        if partitioned.wait_for(|cut| *cut).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let mut down = shared.down.subscribe();
    let stopped = async {
        if down.wait_for(|down| *down).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let cut_off = tokio::select! {
        () = forward(&mut *client, server, shared) => false,
        () = partition => true,
        // Both connections are dropped: closed, as by a server that stopped.
        () = stopped => false,
    };
    if cut_off {
        hold_silently().await;
    }
}

/// Keeps a partitioned client's connection (owned by the caller) open until the proxy goes.
async fn hold_silently() {
    std::future::pending::<()>().await;
}

/// Copies both ways until either side closes or an exchange is cut.
async fn forward<C>(client: C, server: TcpStream, shared: &Shared)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = server.into_split();
    let cut_next_response = AtomicBool::new(false);
    let upload = async {
        let mut heads = RequestHeads::default();
        // Request bytes still to forward before the connection is cut.
        let mut request_left: Option<usize> = None;
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let read = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let data = &buffer[..read];
            let new_heads = if shared.record {
                heads.push(data)
            } else {
                Vec::new()
            };
            for head in new_heads {
                if let Some(cut) = &shared.cut
                    && is_cut(&head, cut)
                    && shared.take_cut(cut.times)
                {
                    if cut.method == "GET" {
                        cut_next_response.store(true, Ordering::SeqCst);
                    } else {
                        // Counted from the read that holds the head: close enough for a test.
                        request_left = Some(cut.after_bytes);
                    }
                }
                shared.heads.lock().expect("heads lock").push(head);
            }
            if let Some(left) = request_left {
                if data.len() >= left {
                    let _ = server_write.write_all(&data[..left]).await;
                    // Returning drops both connections mid-request.
                    return;
                }
                request_left = Some(left - data.len());
            }
            if server_write.write_all(data).await.is_err() {
                break;
            }
        }
    };
    let download = async {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut forwarded_since_cut_request = 0usize;
        loop {
            let read = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let data = &buffer[..read];
            if let Some(cut) = &shared.cut
                && cut_next_response.load(Ordering::SeqCst)
            {
                let room = cut.after_bytes - forwarded_since_cut_request;
                if data.len() >= room {
                    let _ = client_write.write_all(&data[..room]).await;
                    let _ = client_write.flush().await;
                    // Returning drops both connections mid-response.
                    return;
                }
                forwarded_since_cut_request += data.len();
            }
            // A TLS writer may keep the end of what it was given unsent until flushed
            // (tokio-rustls says so): the tail of a response would wait for the next one.
            if client_write.write_all(data).await.is_err() || client_write.flush().await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    tokio::select! {
        () = upload => {}
        () = download => {}
    }
}

impl Shared {
    /// Counts one more cut, unless `times` were made already.
    fn take_cut(&self, times: usize) -> bool {
        self.cuts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |made| {
                (made < times).then_some(made + 1)
            })
            .is_ok()
    }
}

/// Splits a client's byte stream into request heads, skipping bodies by their Content-Length.
#[derive(Default)]
struct RequestHeads {
    pending: Vec<u8>,
    body_left: usize,
}

impl RequestHeads {
    fn push(&mut self, data: &[u8]) -> Vec<String> {
        let mut data = data;
        let skipped = data.len().min(self.body_left);
        self.body_left -= skipped;
        data = &data[skipped..];
        self.pending.extend_from_slice(data);
        let mut heads = Vec::new();
        while self.body_left == 0 {
            let Some(end) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") else {
                break;
            };
            let head = String::from_utf8_lossy(&self.pending[..end]).into_owned();
            self.pending.drain(..end + 4);
            let body = content_length(&head);
            let skipped = body.min(self.pending.len());
            self.pending.drain(..skipped);
            self.body_left = body - skipped;
            heads.push(head);
        }
        heads
    }
}

fn content_length(head: &str) -> usize {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0)
}

fn is_cut(head: &str, cut: &Cut) -> bool {
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default();
    let ranged = lines.any(|line| {
        line.split_once(':')
            .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("range"))
    });
    request_line.starts_with(&format!("{} ", cut.method))
        && request_line.contains(&cut.path_contains)
        && (cut.ranged_too || !ranged)
}
