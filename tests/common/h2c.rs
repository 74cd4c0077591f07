//! An HTTP/2 client with prior knowledge over plain TCP (the `h2` crate),
//! for what a browser-grade client would not send: raw `:authority`
//! values, extension methods, reset floods. The connection's task is kept,
//! so a test can see how the gateway ended the connection.
use bytes::Bytes;
use http::{HeaderMap, Request};
use serde_json::Value;
use std::net::SocketAddr;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// One HTTP/2 connection.
pub struct H2 {
    pub sender: h2::client::SendRequest<Bytes>,
    /// The connection's task: how it ended (a GOAWAY's error code, or Ok
    /// for a clean close).
    pub conn: JoinHandle<Result<(), h2::Error>>,
}

/// A response read to its end.
#[derive(Debug)]
pub struct H2Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The stream ended with the HEADERS frame: no DATA frame at all.
    pub ended_with_headers: bool,
}

impl H2Response {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// A new connection to `addr` (the handshake done).
pub async fn connect(addr: SocketAddr) -> H2 {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = h2::client::handshake(tcp).await.unwrap();
    H2 {
        sender,
        conn: tokio::spawn(conn),
    }
}

/// A `method` request for `http://{addr}{path}`: its `:authority` is `addr`.
pub fn request(addr: SocketAddr, method: &str, path: &str) -> Request<()> {
    Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(())
        .unwrap()
}

impl H2 {
    /// Sends `req` with no body and reads the response to its end.
    pub async fn send(&mut self, req: Request<()>) -> Result<H2Response, h2::Error> {
        self.sender = self.sender.clone().ready().await?;
        let (res, _) = self.sender.send_request(req, true)?;
        let res = res.await?;
        let status = res.status().as_u16();
        let (parts, mut body) = res.into_parts();
        let ended_with_headers = body.is_end_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            let _ = body.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        Ok(H2Response {
            status,
            headers: parts.headers,
            body: Bytes::from(bytes),
            ended_with_headers,
        })
    }
}
