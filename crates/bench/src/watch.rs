//! The dashboard under load: while `tenet bench load` runs, what a dashboard does — one reader
//! following the event stream (`GET /v1/events`) and counting what arrives, one poller reading
//! the page, the nodes and the jobs four times a second and timing each read — and what a
//! reader that never reads does to the coordinator: it must be dropped, not buffered for.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tenet_net::{Method, NodeClient, RawRequest, identity};

/// What the watchers saw.
#[derive(Clone, Debug, Default)]
pub struct WatchReport {
    /// Events the stream's reader received (`data:` lines), and whether its stream ended
    /// early (dropped, or cut).
    pub events: u64,
    pub follower_ended: bool,
    /// Dashboard reads (page, nodes, jobs) and their latencies, ms, sorted.
    pub reads: Vec<f64>,
    pub read_errors: usize,
}

/// Open `GET /v1/events` on `addr` (host:port) with `key`: the connection, its request sent.
async fn open_events(addr: &str, key: &str) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!(
        "GET /v1/events HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\naccept: text/event-stream\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    Ok(s)
}

/// Follow the event stream until `stop`, counting events.
pub async fn follow(
    addr: String,
    key: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (u64, bool) {
    let Ok(mut s) = open_events(&addr, &key).await else {
        return (0, true);
    };
    let mut stop = stop;
    let mut buf = vec![0u8; 64 << 10];
    let (mut events, mut tail) = (0u64, Vec::<u8>::new());
    loop {
        tokio::select! {
            _ = stop.changed() => return (events, false),
            n = s.read(&mut buf) => match n {
                Ok(0) | Err(_) => return (events, true),
                Ok(n) => {
                    tail.extend_from_slice(&buf[..n]);
                    // Count whole lines that start an event; keep a partial line for later.
                    let cut = tail.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                    events += tail[..cut]
                        .split(|&b| b == b'\n')
                        .filter(|l| l.starts_with(b"data: "))
                        .count() as u64;
                    tail.drain(..cut);
                }
            },
        }
    }
}

/// A reader that opens the stream and never reads it: held open until `stop`.
pub async fn stall(addr: String, key: String, stop: tokio::sync::watch::Receiver<bool>) {
    let mut stop = stop;
    if let Ok(s) = open_events(&addr, &key).await {
        let _ = stop.changed().await;
        drop(s);
    }
}

/// Read the dashboard's page, nodes and jobs every 250 ms until `stop`; latencies in ms.
pub async fn poll(
    url: String,
    key: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (Vec<f64>, usize) {
    let Ok(http) = NodeClient::new(&url, identity::generate()) else {
        return (Vec::new(), 1);
    };
    let mut stop = stop;
    let (mut reads, mut errors) = (Vec::new(), 0);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => {
                for path in ["/", "/v1/nodes", "/v1/jobs?limit=20"] {
                    let t = Instant::now();
                    let r = http
                        .send(RawRequest {
                            method: Method::GET,
                            path: path.into(),
                            headers: vec![("authorization".into(), format!("Bearer {key}"))],
                            body: Default::default(),
                        })
                        .await;
                    match r {
                        Ok(r) if r.status == 200 => reads.push(t.elapsed().as_secs_f64() * 1e3),
                        _ => errors += 1,
                    }
                }
            }
        }
    }
    reads.sort_by(|a, b| a.total_cmp(b));
    (reads, errors)
}
