//! HTTP/1.1 to a target, driven by the task of the request it carries: the
//! request head (and a body that is ready) goes out in one write, the
//! response head is parsed with `httparse` into a header map that shares the
//! bytes read, and the response body is decoded as the client reads it. A
//! response that arrived whole with its head gives its connection back at
//! once.
//!
//! Why not hyper's client connection: it runs a task per connection and
//! hands each request over a channel and each response back over a oneshot,
//! two task wake-ups and the channel work per request on top of hyper's
//! general-purpose encoder and parser. hyper-util's client still serves
//! `http2 = true` targets.
//!
//! The framing rules are RFC 9112's and hyper's: no body for a `HEAD`
//! request or a 1xx/204/304 response; `Transfer-Encoding` ending in `chunked`
//! wins over `Content-Length` (any other coding: the body ends with the
//! connection); differing `Content-Length` values are an invalid response;
//! with neither, the body ends with the connection. Interim 1xx responses are
//! skipped (a `101` is refused: the gateway does not tunnel upgrades). While
//! a request body streams, the response side is watched: a target that
//! answers early (a `413` half-way through an upload) has its answer relayed,
//! and the connection is not reused.
//!
//! The files, bottom up: `socket` (the stream), `error`, `conn` (a
//! connection and its deadline timer), `incoming` (the response body),
//! `response` (the response head and its framing), `request` (the request
//! head and streamed body), `exchange` (one request and its response on a
//! connection).
mod conn;
mod error;
mod exchange;
mod incoming;
mod request;
mod response;
mod socket;

pub(crate) use conn::Conn;
pub(crate) use error::{ClientError, SendError};
#[cfg(feature = "fuzzing")]
pub(crate) use incoming::BodyFraming;
pub(crate) use incoming::Incoming;
#[cfg(feature = "fuzzing")]
pub(crate) use response::take_response;
pub(crate) use socket::io;
