//! What both sides of HTTP/1.1 share: what a head says of its body
//! (`framing`), the body decoder (`decoder`), and the socket work (`io`):
//! reads through the stack, writes in one piece, chunk-size lines, and the
//! wait that lets a round of ready writes go out together.
mod decoder;
mod framing;
mod io;

pub(crate) use decoder::Decoder;
pub(crate) use framing::{ends_in_chunked, has_token, parse_length, parse_request_length, Framing};
pub(crate) use io::{
    after_queued_tasks, chunk_tail, poll_read_more, poll_write_buf, read_more, ChunkSize,
};
