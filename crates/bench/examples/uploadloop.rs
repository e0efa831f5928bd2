use std::time::{Duration, Instant};
use tenet_node::{Bytes, NodeClient};
fn main() {
    let url = std::env::args().nth(1).unwrap();
    if url == "key" {
        println!(
            "{}",
            tenet_proto::auth::KeyPair::from_seed([7; 32])
                .public()
                .to_hex()
        );
        return;
    }
    let n: usize = std::env::args().nth(2).map_or(50, |s| s.parse().unwrap());
    let key = tenet_proto::auth::KeyPair::from_seed([7; 32]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = NodeClient::new(&url, key)
            .unwrap()
            .with_busy_poll(Duration::from_micros(200));
        let mut v = vec![];
        let mut hash_ms = vec![];
        for i in 0..n {
            let mut data = vec![0u8; 4 << 20];
            for (j, chunk) in data.chunks_mut(8).enumerate() {
                let x = (j as u64 ^ (i as u64) << 40 ^ std::process::id() as u64)
                    .wrapping_mul(0x9E3779B97F4A7C15);
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            let t = Instant::now();
            let _ = tenet_node::digest::hash_parts(&[&data]);
            hash_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let body = Bytes::from(data);
            let t = Instant::now();
            c.upload_blob(body).await.unwrap();
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        v.sort_by(|a, b| a.total_cmp(b));
        hash_ms.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{} uploads, median {:.2} ms = {:.2} GB/s; client hash alone {:.2} ms",
            n,
            v[n / 2],
            4.194304 / v[n / 2],
            hash_ms[n / 2]
        );
    });
}
