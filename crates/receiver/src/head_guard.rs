//! The public listener's connections: a request head that the HTTP layer would refuse on its
//! own is answered by the app instead, so that answer too carries `X-Request-Id` and leaves a
//! log line with it.
//!
//! actix-http answers a few requests itself, before any middleware sees them: a head it
//! cannot parse (400), a head still incomplete past its 128 KiB buffer or of more than 96
//! headers (431), a first head not received in time (408). Each connection is therefore read
//! through a [`GuardedConnection`], which runs actix-http's own request decoder over the
//! bytes as they arrive and hands the dispatcher only what that decoder has framed: a head
//! once it is complete, body bytes as they come. The dispatcher's decoder, fed the same whole
//! heads, then never refuses one. When the decoder refuses a head, or the first head is late,
//! the connection hands over a request of its own instead, marked with a secret that only the
//! connection and the app know, and reads nothing more; [`answer_refused_head`] answers it
//! (400, 431 or 408, connection closed), after the answers to any requests pipelined before
//! it. A body the decoder refuses (a malformed chunk size) is handed over as it came: that
//! request's read of it fails and the app answers it (400 `body_unreadable`, with its id), as
//! before. Writes pass through untouched.
//!
//! A later head on a kept-alive connection reaches the dispatcher only once complete, so the
//! dispatcher's keep-alive timer (5 s after the previous answer) keeps running while it
//! arrives: a head still incomplete then is dropped with the connection, unanswered.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use actix_codec::Decoder as _;
use actix_http::error::ParseError;
use actix_http::h1::{Codec, Message, MessageType};
use actix_http::{ServiceConfig, ServiceConfigBuilder};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::error::ApiError;

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// The largest head actix-http buffers while waiting for its end.
pub const HTTP_LAYER_MAX_HEAD_BYTES: usize = 128 * 1024;
/// The most headers actix-http parses in one head.
pub const HTTP_LAYER_MAX_HEADERS: usize = 96;

/// Header that marks the request a [`GuardedConnection`] makes in place of a refused head.
const REFUSAL_HEADER: &str = "x-inbox-refused-head";

/// Why a connection's head was refused before the app could see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadRefusal {
    /// The decoder could not parse it (request line, a header, a missing `Host`, ...).
    Malformed(String),
    /// Still incomplete past [`HTTP_LAYER_MAX_HEAD_BYTES`], or over
    /// [`HTTP_LAYER_MAX_HEADERS`].
    TooLarge,
    /// The connection's first head was not complete within the head timeout.
    Late(Duration),
}

impl From<HeadRefusal> for ApiError {
    fn from(refusal: HeadRefusal) -> Self {
        match refusal {
            HeadRefusal::Malformed(cause) => Self::MalformedHead(cause),
            HeadRefusal::TooLarge => Self::HeadTooLargeToParse,
            HeadRefusal::Late(timeout) => Self::HeadTimeout(timeout),
        }
    }
}

/// What a connection and the app share about a refused head; the app finds it in the
/// connection's data.
#[derive(Debug)]
pub struct RefusedHead {
    /// Marks the connection's own request: a client cannot guess it.
    secret: String,
    refusal: OnceLock<HeadRefusal>,
}

/// How a connection is being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// Through the decoder: the dispatcher gets what it framed.
    Guarded,
    /// As it comes: the decoder refused a request's body, which that request's own answer
    /// reports (the app's `body_unreadable`, with its id); the rest is the dispatcher's.
    Unguarded,
    /// Nothing more: the connection's own request, in place of a refused head, was its last.
    Refused,
}

/// A connection of the public listener, read through actix-http's request decoder.
#[derive(Debug)]
pub struct GuardedConnection<T> {
    io: T,
    reading: Reading,
    decoder: Codec,
    /// Bytes read and not yet framed (an incomplete head, the incomplete line of a chunk).
    unframed: BytesMut,
    /// Framed bytes the dispatcher has not taken yet.
    framed: BytesMut,
    head_timeout: Duration,
    /// Until the first head is complete.
    first_head_deadline: Option<Pin<Box<Sleep>>>,
    refused: Arc<RefusedHead>,
}

/// What the connections of one HTTP worker share.
#[derive(Debug, Clone)]
pub struct ConnectionGuard {
    /// The decoders' configuration: making one starts a task that keeps the time for it.
    decoder_config: ServiceConfig,
    head_timeout: Duration,
}

impl ConnectionGuard {
    /// The guard of one HTTP worker, made on its thread, within its local task set: each
    /// connection's first head must be complete within `head_timeout` (zero: any time).
    pub fn new(head_timeout: Duration) -> Self {
        Self {
            decoder_config: ServiceConfigBuilder::new().build(),
            head_timeout,
        }
    }

    /// Starts guarding a new connection.
    pub fn guard<T>(&self, io: T) -> GuardedConnection<T> {
        let head_timeout = self.head_timeout;
        GuardedConnection {
            io,
            reading: Reading::Guarded,
            decoder: Codec::new(self.decoder_config.clone()),
            unframed: BytesMut::new(),
            framed: BytesMut::new(),
            head_timeout,
            first_head_deadline: (!head_timeout.is_zero())
                .then(|| Box::pin(tokio::time::sleep(head_timeout))),
            refused: Arc::new(RefusedHead {
                secret: format!("{:032x}", rand::random::<u128>()),
                refusal: OnceLock::new(),
            }),
        }
    }
}

impl<T> GuardedConnection<T> {
    /// What the app needs to recognise and answer this connection's refusal; goes into the
    /// connection's data.
    pub fn refused_head(&self) -> Arc<RefusedHead> {
        Arc::clone(&self.refused)
    }

    /// Runs the decoder over what arrived and moves what it framed to `framed`.
    fn frame(&mut self) {
        // The decoder consumes what it frames, heads included: it works on a copy, and the
        // bytes passed on are the ones that arrived. An incomplete head is copied again at
        // each read, as the dispatcher parses it again at each read.
        let mut decoding = self.unframed.clone();
        let mut framed_bytes = 0;
        loop {
            let in_body = self.decoder.message_type() != MessageType::None;
            match self.decoder.decode(&mut decoding) {
                Ok(Some(message)) => {
                    if matches!(message, Message::Item(_)) {
                        self.first_head_deadline = None;
                    }
                    framed_bytes = self.unframed.len() - decoding.len();
                }
                Ok(None) => {
                    framed_bytes = self.unframed.len() - decoding.len();
                    break;
                }
                Err(_) if in_body => {
                    // Handed over as it came, the body fails that request's read of it.
                    self.pass_on(self.unframed.len());
                    self.reading = Reading::Unguarded;
                    return;
                }
                Err(error) => {
                    // Counted after each whole message only: the decoder may consume a head
                    // it then refuses (one without `Host`, say).
                    self.pass_on(framed_bytes);
                    self.refuse(refusal_of(&error));
                    return;
                }
            }
        }
        self.pass_on(framed_bytes);
    }

    fn pass_on(&mut self, bytes: usize) {
        let framed = self.unframed.split_to(bytes);
        self.framed.unsplit(framed);
        if self.unframed.is_empty() {
            // Idle connections hold no buffer.
            self.unframed = BytesMut::new();
        }
    }

    /// Replaces the rest of the connection by one request that the app answers with
    /// `refusal`.
    fn refuse(&mut self, refusal: HeadRefusal) {
        self.reading = Reading::Refused;
        self.unframed = BytesMut::new();
        self.first_head_deadline = None;
        let request = format!(
            "GET / HTTP/1.1\r\nhost: receiver\r\nconnection: close\r\n\
             {REFUSAL_HEADER}: {}\r\n\r\n",
            self.refused.secret
        );
        self.framed.extend_from_slice(request.as_bytes());
        let _first = self.refused.refusal.set(refusal);
    }

    fn first_head_is_late(&mut self, cx: &mut Context<'_>) -> bool {
        self.first_head_deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready())
    }
}

fn refusal_of(error: &ParseError) -> HeadRefusal {
    match error {
        ParseError::TooLarge => HeadRefusal::TooLarge,
        other => HeadRefusal::Malformed(other.to_string()),
    }
}

impl<T: AsyncRead + Unpin> GuardedConnection<T> {
    /// Reads once from the socket and frames what came; `Ok(0)` at the end of the stream.
    fn poll_read_and_frame(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut chunk = [0_u8; READ_CHUNK_BYTES];
        let mut read = ReadBuf::new(&mut chunk);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut read))?;
        let arrived = read.filled();
        self.unframed.extend_from_slice(arrived);
        self.frame();
        Poll::Ready(Ok(arrived.len()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for GuardedConnection<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.framed.is_empty() {
                let bytes = this.framed.len().min(buf.remaining());
                buf.put_slice(&this.framed[..bytes]);
                this.framed.advance(bytes);
                if this.framed.is_empty() {
                    this.framed = BytesMut::new();
                }
                return Poll::Ready(Ok(()));
            }
            match this.reading {
                Reading::Refused => return Poll::Pending,
                Reading::Unguarded => return Pin::new(&mut this.io).poll_read(cx, buf),
                Reading::Guarded => {}
            }
            match this.poll_read_and_frame(cx) {
                // The end of the stream: a head begun and not finished goes with it.
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => {
                    if !this.first_head_is_late(cx) {
                        return Poll::Pending;
                    }
                    this.refuse(HeadRefusal::Late(this.head_timeout));
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GuardedConnection<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Middleware: answers the request a [`GuardedConnection`] made in place of a refused head
/// (and logs it, with the request id; the log line's span shows that request, `GET /` for
/// host `receiver`, not the refused head); every other request goes on to the app.
pub fn answer_refused_head<S>(
    request: ServiceRequest,
    service: &S,
) -> futures_util::future::Either<
    S::Future,
    std::future::Ready<Result<ServiceResponse, actix_web::Error>>,
>
where
    S: Service<ServiceRequest, Response = ServiceResponse, Error = actix_web::Error>,
{
    let refusal = request.headers().get(REFUSAL_HEADER).and_then(|marker| {
        let refused = request.conn_data::<Arc<RefusedHead>>()?;
        (marker.as_bytes() == refused.secret.as_bytes())
            .then(|| refused.refusal.get().cloned())
            .flatten()
    });
    match refusal {
        Some(refusal) => {
            let error = ApiError::from(refusal);
            tracing::warn!(
                code = error.code(),
                error = %error.chain(),
                peer = ?request.peer_addr(),
                "request head refused",
            );
            let answer = actix_web::ResponseError::error_response(&error);
            futures_util::future::Either::Right(std::future::ready(Ok(
                request.into_response(answer)
            )))
        }
        None => futures_util::future::Either::Left(service.call(request)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// What the dispatcher would read from a connection over which `sent` arrives in pieces
    /// of `piece` bytes, then the end of the stream; and the connection's refusal, if any.
    async fn dispatcher_reads(sent: &[u8], piece: usize) -> (Vec<u8>, Option<HeadRefusal>) {
        let sent = sent.to_vec();
        let worker = tokio::task::LocalSet::new();
        worker
            .run_until(async move {
                let (mut client, server) = tokio::io::duplex(1024 * 1024);
                let mut connection = ConnectionGuard::new(Duration::from_secs(30)).guard(server);
                tokio::task::spawn_local(async move {
                    for part in sent.chunks(piece) {
                        client
                            .write_all(part)
                            .await
                            .unwrap_or_else(|e| panic!("{e}"));
                        // The connection reads this piece before the next arrives.
                        tokio::task::yield_now().await;
                    }
                });
                let mut read = Vec::new();
                // A refused connection never ends its stream: read what it hands over.
                let _ = tokio::time::timeout(
                    Duration::from_millis(500),
                    connection.read_to_end(&mut read),
                )
                .await;
                (read, connection.refused.refusal.get().cloned())
            })
            .await
    }

    #[tokio::test]
    async fn whole_requests_pass_unchanged_however_they_arrive() {
        let requests: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
            POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
            GET /c HTTP/1.1\r\nHost: x\r\n\r\n";
        for piece in [1, 7, 64, requests.len()] {
            let (read, refusal) = dispatcher_reads(requests, piece).await;
            assert_eq!(read, requests, "in pieces of {piece}");
            assert_eq!(refusal, None);
        }
    }

    #[tokio::test]
    async fn a_malformed_head_after_a_good_request_becomes_the_connections_own_request() {
        let good: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
        let sent = [good, b"GET /b HTTP/1.1\r\nno colon here\r\n\r\n"].concat();
        for piece in [1, 5, sent.len()] {
            let (read, refusal) = dispatcher_reads(&sent, piece).await;
            assert!(read.starts_with(good), "in pieces of {piece}");
            let own = String::from_utf8_lossy(&read[good.len()..]).into_owned();
            assert!(own.starts_with("GET / HTTP/1.1\r\n"), "{own}");
            assert!(own.contains(REFUSAL_HEADER), "{own}");
            assert!(matches!(refusal, Some(HeadRefusal::Malformed(_))));
        }
    }

    #[tokio::test]
    async fn a_head_the_decoder_consumes_then_refuses_is_not_passed_on() {
        // HTTP/1.1 without Host: refused after the head was taken off the buffer.
        let (read, refusal) = dispatcher_reads(b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", 4).await;
        assert!(read.starts_with(b"GET / HTTP/1.1\r\nhost: receiver\r\n"));
        assert!(matches!(refusal, Some(HeadRefusal::Malformed(_))));
    }

    #[tokio::test]
    async fn a_body_the_decoder_refuses_is_passed_on_as_it_came_for_its_request_to_fail() {
        let sent: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
            zz\r\n{}\r\n0\r\n\r\n";
        let (read, refusal) = dispatcher_reads(sent, 3).await;
        assert_eq!(read, sent);
        assert_eq!(refusal, None);
    }

    #[tokio::test]
    async fn a_head_past_the_http_layers_buffer_is_refused_as_too_large() {
        let mut sent = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
        while sent.len() <= HTTP_LAYER_MAX_HEAD_BYTES {
            sent.extend_from_slice(b"X-Filler: ffffffffffffffffffffffffffffffffffffffff\r\n");
        }
        let (_, refusal) = dispatcher_reads(&sent, 4096).await;
        assert_eq!(refusal, Some(HeadRefusal::TooLarge));
    }

    #[tokio::test]
    async fn a_first_head_not_complete_in_time_is_refused_as_late() {
        let worker = tokio::task::LocalSet::new();
        worker
            .run_until(async {
                let (mut client, server) = tokio::io::duplex(1024);
                let mut connection = ConnectionGuard::new(Duration::from_millis(50)).guard(server);
                client
                    .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                let mut read = [0_u8; 512];
                let bytes = connection
                    .read(&mut read)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert!(read[..bytes].starts_with(b"GET / HTTP/1.1\r\nhost: receiver\r\n"));
                assert_eq!(
                    connection.refused.refusal.get(),
                    Some(&HeadRefusal::Late(Duration::from_millis(50)))
                );
            })
            .await;
    }
}
