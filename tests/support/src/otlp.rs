//! A minimal OTLP/HTTP trace receiver on loopback, plain or over TLS, that keeps the body of
//! every `POST /v1/traces` and answers it with an empty `ExportTraceServiceResponse`.
//!
//! Protobuf keeps strings as plain UTF-8 and ids (trace id: 16 bytes, span id: 8 bytes) as raw
//! bytes, so a test finds span names, attribute values, the service name and ids in the bodies
//! without decoding them ([`OtlpReceiver::contains`], [`OtlpReceiver::contains_hex`]).
//! Compressed exports (`OTEL_EXPORTER_OTLP_COMPRESSION`) are kept as they come, undecoded.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::BufReader;
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt,
};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

type Bodies = Arc<Mutex<Vec<Vec<u8>>>>;

/// Outcomes of TLS handshakes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handshakes {
    pub succeeded: usize,
    pub failed: usize,
}

/// The receiver; it stops when dropped.
pub struct OtlpReceiver {
    /// `http://127.0.0.1:<port>` or `https://127.0.0.1:<port>`: the value for
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter adds `/v1/traces`).
    pub endpoint: String,
    /// PEM file of the CA that signed the receiver's certificate (TLS receivers only): the value
    /// for `OTEL_EXPORTER_OTLP_CERTIFICATE`.
    pub ca_bundle: Option<PathBuf>,
    bodies: Bodies,
    /// TLS handshakes that succeeded and that failed (a client that does not trust the CA).
    handshakes: Arc<Mutex<Handshakes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    /// A plain-text receiver.
    pub async fn http() -> OtlpReceiver {
        OtlpReceiver::start(None, None).await
    }

    /// A TLS receiver with a certificate for 127.0.0.1 signed by a CA made for it; the CA's PEM
    /// is written to `work/otlp-ca.pem`.
    pub async fn https(work: &Path) -> OtlpReceiver {
        let (ca_pem, config) = crate::proxy::certificates();
        let ca_bundle = work.join("otlp-ca.pem");
        std::fs::write(&ca_bundle, ca_pem).expect("writing the CA bundle");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        OtlpReceiver::start(Some(acceptor), Some(ca_bundle)).await
    }

    async fn start(tls: Option<TlsAcceptor>, ca_bundle: Option<PathBuf>) -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("receiver binds");
        let address = listener.local_addr().expect("receiver address");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let bodies = Bodies::default();
        let handshakes = Arc::new(Mutex::new(Handshakes::default()));
        let task = tokio::spawn(serve(
            listener,
            tls,
            Arc::clone(&bodies),
            Arc::clone(&handshakes),
        ));
        OtlpReceiver {
            endpoint: format!("{scheme}://{address}"),
            ca_bundle,
            bodies,
            handshakes,
            task,
        }
    }

    /// The bodies of the export requests so far.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        self.bodies.lock().expect("bodies lock").clone()
    }

    /// Export requests so far.
    pub fn requests(&self) -> usize {
        self.bodies.lock().expect("bodies lock").len()
    }

    /// TLS handshakes so far (a gRPC client's too, which the receiver cannot serve further).
    pub fn handshakes(&self) -> Handshakes {
        *self.handshakes.lock().expect("handshakes lock")
    }

    /// Whether some export request's body contains `needle`.
    pub fn contains(&self, needle: &[u8]) -> bool {
        !needle.is_empty()
            && self
                .bodies
                .lock()
                .expect("bodies lock")
                .iter()
                .any(|body| body.windows(needle.len()).any(|window| window == needle))
    }

    /// [`OtlpReceiver::contains`] for the raw bytes that `hex` (a trace or span id) spells.
    pub fn contains_hex(&self, hex: &str) -> bool {
        self.contains(&decode_hex(hex))
    }

    /// Waits up to `timeout` for an export request containing `needle`.
    pub async fn wait_for(&self, needle: &[u8], timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.contains(needle) {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }
}

/// The bytes of a hexadecimal string (panics on odd lengths or non-hex digits).
pub fn decode_hex(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length: {hex}");
    (0..hex.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(&hex[index..index + 2], 16).expect("hex digits"))
        .collect()
}

async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    bodies: Bodies,
    handshakes: Arc<Mutex<Handshakes>>,
) {
    let mut connections = JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        while connections.try_join_next().is_some() {}
        let bodies = Arc::clone(&bodies);
        let handshakes = Arc::clone(&handshakes);
        let tls = tls.clone();
        connections.spawn(async move {
            let Some(acceptor) = tls else {
                return exchange(stream, &bodies).await;
            };
            let accepted = acceptor.accept(stream).await;
            {
                let mut handshakes = handshakes.lock().expect("handshakes lock");
                match accepted {
                    Ok(_) => handshakes.succeeded += 1,
                    Err(_) => handshakes.failed += 1,
                }
            }
            if let Ok(stream) = accepted {
                exchange(stream, &bodies).await;
            }
        });
    }
}

/// Serves the requests of one connection until the client closes it.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(stream: S, bodies: &Bodies) {
    let mut stream = BufReader::new(stream);
    while let Some((request_line, body)) = read_request(&mut stream).await {
        let traces = request_line.starts_with("POST /v1/traces ");
        if traces {
            bodies.lock().expect("bodies lock").push(body);
        }
        let status = if traces { "200 OK" } else { "404 Not Found" };
        // An empty ExportTraceServiceResponse encodes to zero bytes.
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
        );
        if stream.write_all(response.as_bytes()).await.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
}

/// One request: its request line and its body (by Content-Length, or chunked).
async fn read_request<S: AsyncBufRead + Unpin>(stream: &mut S) -> Option<(String, Vec<u8>)> {
    let request_line = read_line(stream).await?;
    let mut length = 0;
    let mut chunked = false;
    loop {
        let line = read_line(stream).await?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().ok()?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let body = if chunked {
        read_chunked(stream).await?
    } else {
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.ok()?;
        body
    };
    Some((request_line, body))
}

async fn read_chunked<S: AsyncBufRead + Unpin>(stream: &mut S) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = read_line(stream).await?;
        let size = usize::from_str_radix(size_line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(stream).await?.is_empty() {}
            return Some(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        stream.read_exact(&mut body[start..]).await.ok()?;
        read_line(stream).await?;
    }
}

/// A line without its CRLF; `None` at the end of the stream.
async fn read_line<S: AsyncBufRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut line = String::new();
    match stream.read_line(&mut line).await {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end_matches(['\r', '\n']).to_owned()),
    }
}
