//! The signed client against hostile servers (issue 29, item 5): a node that never answers,
//! or answers without end, costs a caller its deadline and at most its answer limit in memory,
//! never a hung task or an unbounded buffer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tenet_net::client::{Bounds, reveal_answer_limit};
use tenet_net::{ClientError, NodeClient, identity};
use tenet_proto::Hash;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a hostile server treats each connection once it has read a request head.
#[derive(Clone, Copy)]
enum Hostile {
    /// Reads the request and never answers.
    Silent,
    /// Answers 200 with a chunked body that never ends, as fast as the client reads.
    Endless,
    /// Answers 200 with a chunked body that never ends, one small chunk every 50 ms.
    Trickle,
    /// Declares an enormous Content-Length and then sends nothing.
    Declares(u64),
}

/// What a hostile server saw: body bytes it managed to send, and whether the client hung up.
#[derive(Default)]
struct Seen {
    sent: AtomicU64,
    hung_up: AtomicU64,
}

/// Start a hostile server on 127.0.0.1; its address and what it saw.
async fn hostile(kind: Hostile) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, kind, s.clone()));
        }
    });
    (addr, seen)
}

async fn serve(mut stream: TcpStream, kind: Hostile, seen: Arc<Seen>) {
    // Read up to the end of the request head.
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let chunk = vec![b'x'; 64 << 10];
    let chunk_head = format!("{:x}\r\n", chunk.len());
    let result: std::io::Result<()> = async {
        match kind {
            Hostile::Silent => {
                // Wait for the client to hang up.
                while stream.read(&mut buf).await? > 0 {}
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            Hostile::Declares(n) => {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\n\r\n");
                stream.write_all(head.as_bytes()).await?;
                while stream.read(&mut buf).await? > 0 {}
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            Hostile::Endless | Hostile::Trickle => {
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await?;
                let piece: &[u8] = match kind {
                    Hostile::Trickle => b"1\r\nx\r\n",
                    _ => &chunk,
                };
                loop {
                    if matches!(kind, Hostile::Trickle) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        stream.write_all(piece).await?;
                        seen.sent.fetch_add(1, Ordering::Relaxed);
                    } else {
                        stream.write_all(chunk_head.as_bytes()).await?;
                        stream.write_all(piece).await?;
                        stream.write_all(b"\r\n").await?;
                        seen.sent.fetch_add(piece.len() as u64, Ordering::Relaxed);
                    }
                }
            }
        }
    }
    .await;
    if result.is_err() {
        seen.hung_up.fetch_add(1, Ordering::Relaxed);
    }
}

fn client(addr: &str) -> NodeClient {
    NodeClient::new(addr, identity::generate()).unwrap()
}

/// Wait (at most `limit`) until the server saw the client hang up.
async fn hung_up(seen: &Seen, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if seen.hung_up.load(Ordering::Relaxed) > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn a_node_that_never_answers_fails_the_call_at_its_deadline_and_loses_the_connection() {
    let (addr, seen) = hostile(Hostile::Silent).await;
    let c = client(&addr);
    let started = Instant::now();
    let bounds = Bounds::new(Duration::from_millis(300), reveal_answer_limit(1));
    // Bounded from outside too, generously, so a regression fails instead of hanging.
    let e = tokio::time::timeout(Duration::from_secs(30), c.reveal_within("job-1", bounds))
        .await
        .expect("the client gives up by itself")
        .unwrap_err();
    assert!(
        matches!(e, ClientError::Timeout { limit_ms, .. } if limit_ms <= 300),
        "{e}"
    );
    assert!(e.to_string().contains("did not answer within"), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        hung_up(&seen, Duration::from_secs(10)).await,
        "the abandoned connection is closed"
    );
    // The client's own default applies to calls without bounds.
    let c = client(&addr).with_timeout(Duration::from_millis(200));
    let e = tokio::time::timeout(Duration::from_secs(30), c.info())
        .await
        .expect("the client gives up by itself")
        .unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
}

#[tokio::test]
async fn an_endless_answer_stops_at_the_callers_limit() {
    let (addr, seen) = hostile(Hostile::Endless).await;
    let c = client(&addr);
    let limit = 1 << 20;
    let bounds = Bounds::new(Duration::from_secs(30), limit);
    let e = c
        .get_blob_within(&Hash::of(b"x"), bounds)
        .await
        .unwrap_err();
    match &e {
        // Stopped within one frame of the limit; what was kept never passed it.
        ClientError::TooLarge { limit: l, size, .. } => {
            assert_eq!(*l, limit);
            assert!(*size > limit && *size <= limit + (4 << 20), "{size}");
        }
        other => panic!("expected TooLarge, got {other}"),
    }
    assert!(
        e.to_string().contains("larger than the 1048576 bytes"),
        "{e}"
    );
    assert!(
        hung_up(&seen, Duration::from_secs(10)).await,
        "the client hung up instead of reading on"
    );
    // What the server got out before the client hung up: the limit, plus what socket buffers
    // hold, nowhere near an endless stream.
    let sent = seen.sent.load(Ordering::Relaxed);
    assert!(sent < 64 << 20, "the server wrote {sent} bytes");
    // The client's default blob limit bounds calls without their own bounds too.
    let c = client(&addr).with_answer_limits(1 << 10, 2 << 20);
    let e = c.get_blob(&Hash::of(b"x")).await.unwrap_err();
    assert!(
        matches!(e, ClientError::TooLarge { limit, .. } if limit == 2 << 20),
        "{e}"
    );
}

#[tokio::test]
async fn a_declared_length_past_the_limit_fails_before_any_body_is_read() {
    let (addr, _) = hostile(Hostile::Declares(1 << 40)).await;
    let bounds = Bounds::new(Duration::from_secs(30), 1 << 20);
    let e = client(&addr)
        .tensor_by_hash_within(&Hash::of(b"x"), bounds)
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::TooLarge { size, .. } if size == 1 << 40),
        "{e}"
    );
}

#[tokio::test]
async fn a_trickling_answer_fails_at_the_deadline() {
    let (addr, seen) = hostile(Hostile::Trickle).await;
    let bounds = Bounds::new(Duration::from_millis(500), 1 << 20);
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        client(&addr).get_blob_within(&Hash::of(b"x"), bounds),
    )
    .await
    .expect("the client gives up by itself")
    .unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
    assert!(hung_up(&seen, Duration::from_secs(10)).await);
}
