//! The event stream as a dashboard reads it, over HTTP on a local network: the API key is
//! required unless the reads are public; a reader that keeps up gets every event; a reader that
//! never reads is dropped (its subscription freed) instead of having events buffered for it.

use std::time::{Duration, Instant};

use tenet_coordinator::CoordinatorConfig;
use tenet_local::LocalNetwork;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn open(addr: &str, key: Option<&str>) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let auth = key.map_or(String::new(), |k| format!("authorization: Bearer {k}\r\n"));
    let req = format!("GET /v1/events HTTP/1.1\r\nhost: {addr}\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// Read until `pred` holds on what was read so far, or the stream ends, or `limit` passes.
async fn read_until(s: &mut TcpStream, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    while Instant::now() < until && !pred(&String::from_utf8_lossy(&got)) {
        match tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_keeps_readers_that_read_and_drops_one_that_does_not() {
    let dir = std::env::temp_dir().join(format!("tenet-events-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let net = LocalNetwork::start(&dir, &[None, None], 1000, CoordinatorConfig::default())
        .await
        .unwrap();
    let addr = net
        .coordinator_url
        .trim_start_matches("http://")
        .to_string();
    let events = &net.core.events;

    // Without the key: refused, and nothing subscribed.
    let mut anon = open(&addr, None).await;
    let head = read_until(&mut anon, Duration::from_secs(10), |t| {
        t.contains("\r\n\r\n")
    })
    .await;
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    assert_eq!(events.subscribers(), 0);

    // A reader that keeps up starts from the backlog (the nodes joining).
    let mut reader = open(&addr, Some(&net.api_key)).await;
    let first = read_until(&mut reader, Duration::from_secs(10), |t| {
        t.matches("\"phase\":\"joined\"").count() == 2
    })
    .await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(first.contains("text/event-stream"), "{first}");
    // A reader that never reads.
    let stalled = open(&addr, Some(&net.api_key)).await;
    let until = Instant::now() + Duration::from_secs(10);
    while events.subscribers() < 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(events.subscribers(), 2);

    // 40 000 events of half a kilobyte (20 MB), in bursts of 200 each waited for until the
    // reader has them (so it never falls behind, whatever the machine's load): far more than
    // the stalled reader's socket can hold.
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = seen.clone();
    let reading = tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 16];
        let mut text = String::new();
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return reader,
                Ok(n) => {
                    text.push_str(&String::from_utf8_lossy(&buf[..n]));
                    // Whole events only; a partial one waits for the rest.
                    let cut = text.rfind("\n\n").map_or(0, |i| i + 2);
                    let done = text[..cut].matches("\"event\":\"burst\"").count();
                    counted.fetch_add(done, std::sync::atomic::Ordering::AcqRel);
                    text.drain(..cut);
                }
            }
        }
    });
    let pad = "x".repeat(480);
    let deadline = Instant::now() + Duration::from_secs(300);
    for burst in 0..200 {
        for j in 0..200 {
            events.emit(
                "burst",
                serde_json::json!({"i": burst * 200 + j, "pad": pad}),
            );
        }
        let want = (burst + 1) * 200;
        while seen.load(std::sync::atomic::Ordering::Acquire) < want && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::Acquire),
        40_000,
        "the reader that keeps up got every event"
    );
    // The stalled one is dropped: behind by a whole ring, or an event unread for too long.
    let until = Instant::now() + tenet_coordinator::dashboard::SLOW_CONSUMER * 3;
    while events.subscribers() > 1 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        events.subscribers(),
        1,
        "the reader that never reads is still subscribed"
    );
    drop(stalled);
    net.shutdown().await;
    // Shutting down ends the live stream (after the `shutdown` event), so it holds nothing up.
    let _reader = tokio::time::timeout(Duration::from_secs(30), reading)
        .await
        .expect("the stream ends when the coordinator stops")
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
