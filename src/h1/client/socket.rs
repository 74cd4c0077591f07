//! The stream to a target: TCP itself, or TLS over TCP for `https://`
//! targets, as the connector made it.
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::either::Either;

/// A target's stream: plain TCP unwrapped (left), TLS as the connector
/// made it (right). Unwrapped, a read or write of plain TCP crosses no
/// adapter between tokio's I/O traits and hyper's (two through the
/// connector's stream, with a read buffer converted each way).
pub(crate) type Io = Either<TcpStream, TokioIo<MaybeHttpsStream<TokioIo<TcpStream>>>>;

/// The connector's stream as an [`Io`].
pub(crate) fn io(stream: MaybeHttpsStream<TokioIo<TcpStream>>) -> Io {
    match stream {
        MaybeHttpsStream::Http(tcp) => Either::Left(tcp.into_inner()),
        tls => Either::Right(TokioIo::new(tls)),
    }
}
