//! The body the client sends: bytes handed to hyper whole, or in 1 MiB slices that count what
//! the connection has taken so far (what an upload progress bar shows).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

/// Slice size when counting: small enough for a smooth bar, large enough to cost nothing.
const SLICE: usize = 1 << 20;

/// A request body of known length.
pub struct Tracked {
    data: Bytes,
    offset: usize,
    taken: Option<Arc<AtomicU64>>,
}

impl Tracked {
    /// The bytes in one frame.
    pub fn whole(data: Bytes) -> Tracked {
        Tracked {
            data,
            offset: 0,
            taken: None,
        }
    }

    /// The bytes in slices, adding each slice's length to `taken` as the connection takes it.
    pub fn counted(data: Bytes, taken: Arc<AtomicU64>) -> Tracked {
        Tracked {
            data,
            offset: 0,
            taken: Some(taken),
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let rest = self.data.len() - self.offset;
        if rest == 0 {
            return Poll::Ready(None);
        }
        let n = match &self.taken {
            Some(_) => rest.min(SLICE),
            None => rest,
        };
        let slice = self.data.slice(self.offset..self.offset + n);
        self.offset += n;
        if let Some(t) = &self.taken {
            t.fetch_add(n as u64, Ordering::Relaxed);
        }
        Poll::Ready(Some(Ok(Frame::data(slice))))
    }

    fn is_end_stream(&self) -> bool {
        self.offset == self.data.len()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact((self.data.len() - self.offset) as u64)
    }
}
