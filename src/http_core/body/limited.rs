//! A body bounded to a size, for `server.limits.max_body_bytes`.
use bytes::Bytes;

use super::BoxError;

/// A body that fails with [`TooLarge`] once it has given more than its
/// limit. Unlike `http_body_util::Limited`, its size hint is the inner
/// body's own: `Limited` turns a hint at or past the limit into an exact
/// size equal to the limit, which the upstream client would then declare as
/// the `Content-Length` of a body its client never sent whole.
pub struct Limited<B> {
    inner: B,
    remaining: u64,
}

impl<B> Limited<B> {
    /// `inner`, limited to `limit` bytes.
    pub fn new(inner: B, limit: u64) -> Self {
        Limited {
            inner,
            remaining: limit,
        }
    }
}

/// A body went past its limit (`server.limits.max_body_bytes`).
#[derive(Debug, thiserror::Error)]
#[error("the body is larger than its limit")]
pub struct TooLarge;

impl<B> http_body::Body for Limited<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let frame = match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            std::task::Poll::Pending => return std::task::Poll::Pending,
            std::task::Poll::Ready(frame) => frame,
        };
        std::task::Poll::Ready(match frame {
            Some(Ok(frame)) => match frame.data_ref().map(|d| d.len() as u64) {
                Some(n) if n > this.remaining => {
                    this.remaining = 0;
                    Some(Err(Box::new(TooLarge)))
                }
                Some(n) => {
                    this.remaining -= n;
                    Some(Ok(frame))
                }
                None => Some(Ok(frame)),
            },
            Some(Err(e)) => Some(Err(e.into())),
            None => None,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_core::body::full;
    use http_body::Body as _;

    #[tokio::test]
    async fn a_limited_body_keeps_its_size_and_fails_past_the_limit() {
        // `http_body_util::Limited` would say exactly 4 here: a length the
        // upstream client would declare for a body it never gets whole.
        let body = Limited::new(full("0123456789"), 4);
        assert_eq!(body.size_hint().exact(), Some(10));
        let err = http_body_util::BodyExt::collect(body).await.unwrap_err();
        assert!(err.is::<TooLarge>(), "{err}");
        let body = Limited::new(full("0123"), 4);
        assert_eq!(body.size_hint().exact(), Some(4));
        let got = http_body_util::BodyExt::collect(body).await.unwrap();
        assert_eq!(got.to_bytes(), "0123");
    }
}
