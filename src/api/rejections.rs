//! hyper's own answers, as problem documents.
//!
//! hyper answers a request it cannot parse by itself, before herald's handler exists for it:
//! 400 (malformed request line or header), 414 (URI too long), 431 (head larger than the read
//! buffer), each with an empty body, then it closes the connection. hyper 1 has no hook for
//! those answers, so [`ProblemIo`] sits between hyper and the socket and replaces exactly such
//! an answer — a 400/414/431 head with `content-length: 0` and nothing after it, which herald's
//! own handlers never produce (every error of theirs carries a problem document) — with the
//! same status line and an RFC 9457 body.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use hyper::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::problem::Problem;

/// A connection's stream, with hyper's empty-bodied rejections rewritten.
pub struct ProblemIo<T> {
    inner: T,
    /// A replacement being written: bytes, how many are written, and the length of hyper's
    /// buffer to report once all of it is.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<T> ProblemIo<T> {
    pub fn new(inner: T) -> ProblemIo<T> {
        ProblemIo {
            inner,
            pending: None,
        }
    }
}

/// The problem document answer for hyper's answer `head`, if that is what `head` is.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    if !head.starts_with(b"HTTP/1.") || !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let (status, kind, title, detail) = match head.get(9..12)? {
        b"400" => (
            StatusCode::BAD_REQUEST,
            "bad-request",
            "Bad request",
            "the request could not be parsed as HTTP/1.1 (request line or a header is malformed)",
        ),
        b"414" => (
            StatusCode::URI_TOO_LONG,
            "uri-too-long",
            "URI too long",
            "the request target is too long",
        ),
        b"431" => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            "Request header fields too large",
            "the request head is larger than herald reads (64 KiB) or has more than 100 headers",
        ),
        _ => return None,
    };
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.trim_end_matches("\r\n").split("\r\n");
    let status_line = lines.next()?;
    let mut date = None;
    for line in lines {
        let lower = line.to_ascii_lowercase();
        // hyper's rejection is these three headers; `connection: close` is written below.
        if lower == "content-length: 0" || lower == "connection: close" {
            continue;
        }
        if lower.starts_with("date:") {
            date = Some(line);
            continue;
        }
        return None; // a header hyper's rejection does not have: not hyper's rejection
    }
    let body = Problem::new(status, kind, title, detail)
        .document()
        .to_string();
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if let Some(d) = date {
        out.push_str(d);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    Some(out.into_bytes())
}

impl<T: AsyncRead + Unpin> AsyncRead for ProblemIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ProblemIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_none() {
            match replacement(buf) {
                Some(bytes) => this.pending = Some((bytes, 0, buf.len())),
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        // hyper calls again with the same buffer until it is reported written.
        let Some((bytes, written, report)) = this.pending.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        while *written < bytes.len() {
            let rest = bytes.get(*written..).unwrap_or_default();
            match ready!(Pin::new(&mut this.inner).poll_write(cx, rest)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => *written += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        let report = *report;
        this.pending = None;
        Poll::Ready(Ok(report))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    // Not vectored: hyper then hands each answer over as one buffer, so a rejection's head is
    // seen whole.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::replacement;

    #[test]
    fn hypers_rejections_become_problem_documents_and_nothing_else_is_touched() {
        let hyper_431 =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Sun, 29 Nov 2026 16:15:54 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(hyper_431).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(out.contains("content-type: application/problem+json\r\n"));
        assert!(out.contains("date: Sun, 29 Nov 2026"));
        let body = out.split_once("\r\n\r\n").unwrap().1;
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["status"], 431);
        // herald's own answers are left alone.
        for other in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 10\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{\"a\":1}",
            b"{\"tasks\": []}",
        ] {
            assert!(replacement(other).is_none(), "{}", String::from_utf8_lossy(other));
        }
    }
}
