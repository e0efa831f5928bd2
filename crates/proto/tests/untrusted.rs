//! What a node decodes from strangers, mutated at random: job and batch bodies, tensor blobs,
//! signature headers. Nothing panics; an accepted tensor blob is canonical. (The same inputs
//! are fuzzed without bound by `cargo fuzz run decode_request`.)

use tenet_ir::{DType, HostTensor, TensorType};
use tenet_proto::auth::{AuthHeaders, HEADER_NAMES, KeyPair, MAC_HEADER, SIGNATURE_HEADER};
use tenet_proto::commit::{JobSpec, Tier};
use tenet_proto::wire::{Batch, RunJob, SessionOp};
use tenet_proto::{ApiError, Hash, tensor};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => v.truncate(rng.below(v.len() + 1)),
            3 => {
                let i = rng.below(v.len() + 1);
                let alphabet = b"{}[]\",:0\\\x00\xff9e-";
                v.insert(i, alphabet[rng.below(alphabet.len())]);
            }
            _ if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            _ => {}
        }
    }
    v
}

fn seeds() -> Vec<Vec<u8>> {
    let t = HostTensor::from_f32(&[2, 2], &[1.0, -0.0, f32::NAN, f32::INFINITY]).unwrap();
    let job = RunJob {
        job: JobSpec {
            job_id: "job-1".into(),
            task: Hash::of(b"task"),
            weights: Some(Hash::of(b"w")),
            inputs: [("x".to_string(), tensor::hash(&t))].into(),
            tier: Tier::Tolerant,
            seed: 9,
        },
        timeout_ms: Some(5),
        blobs: [(tensor::hash(&t), tenet_proto::to_hex(&tensor::encode(&t)))].into(),
        pulls: Default::default(),
        stage: None,
    };
    let batch = Batch {
        ops: vec![
            SessionOp::Put {
                name: "x".into(),
                blob: tenet_proto::to_hex(&tensor::encode(&t)),
            },
            SessionOp::Run {
                task: Hash::of(b"task"),
                weights: None,
                inputs: [("x".to_string(), "x".to_string())].into(),
                outputs: [("y".to_string(), "y".to_string())].into(),
                seed: 0,
            },
            SessionOp::Get { name: "y".into() },
            SessionOp::Free { name: "x".into() },
            SessionOp::Write {
                name: "cache".into(),
                from: "row".into(),
                row: 3,
            },
            SessionOp::Pull {
                name: "z".into(),
                hash: Hash::of(b"z"),
                peer: "http://127.0.0.1:1".into(),
            },
        ],
    };
    let client = KeyPair::from_seed([3; 32]);
    let headers = client
        .sign_request("POST", "/v1/jobs", &Hash::of(b"{}"), 1000, [4; 16])
        .to_pairs()
        .map(|(_, v)| v)
        .join("\n");
    let session = client.session_key(&server().public()).unwrap();
    let mac_headers = client
        .mac_request(
            &session,
            "POST",
            "/v1/jobs",
            &Hash::of(b"{}"),
            1000,
            [5; 16],
        )
        .to_pairs()
        .map(|(_, v)| v)
        .join("\n");
    vec![
        serde_json::to_vec(&job).unwrap(),
        serde_json::to_vec(&batch).unwrap(),
        tensor::encode(&t),
        tensor::encode(&HostTensor::from_i64(&[], &[7]).unwrap()),
        headers.into_bytes(),
        mac_headers.into_bytes(),
    ]
}

fn decode_everything(data: &[u8]) {
    let _ = serde_json::from_slice::<RunJob>(data);
    let _ = serde_json::from_slice::<Batch>(data);
    if let Ok(t) = tensor::decode(data) {
        assert_eq!(
            tensor::encode(&t),
            data,
            "accepted a non-canonical tensor blob"
        );
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let values: Vec<&str> = text.splitn(5, '\n').collect();
        // The fifth line as a signature, then as a MAC (checked where it is meant for).
        for fifth in [SIGNATURE_HEADER, MAC_HEADER] {
            if let Ok(h) = headers_from_lines(&values, fifth) {
                let _ = h.verify("POST", "/v1/jobs", h.timestamp, 30);
                if let Some(session) = server().session_key(&h.key) {
                    let _ = h.verify_mac(&session, "POST", "/v1/jobs", h.timestamp, 30);
                }
            }
        }
    }
}

/// The request headers a line each, in [`HEADER_NAMES`] order with `fifth` naming the proof.
fn headers_from_lines(values: &[&str], fifth: &'static str) -> Result<AuthHeaders, ApiError> {
    let mut names = HEADER_NAMES;
    names[4] = fifth;
    AuthHeaders::from_headers(|name| {
        names
            .iter()
            .position(|n| *n == name)
            .and_then(|i| values.get(i).copied())
    })
}

/// The server the MAC seed is made for.
fn server() -> KeyPair {
    KeyPair::from_seed([7; 32])
}

#[test]
fn mutated_requests_never_panic_and_accepted_blobs_are_canonical() {
    let seeds = seeds();
    // The seeds themselves decode.
    assert!(serde_json::from_slice::<RunJob>(&seeds[0]).is_ok());
    assert!(serde_json::from_slice::<Batch>(&seeds[1]).is_ok());
    assert!(tensor::decode(&seeds[2]).is_ok());
    let mac = std::str::from_utf8(&seeds[5]).unwrap();
    let values: Vec<&str> = mac.split('\n').collect();
    let h = headers_from_lines(&values, MAC_HEADER).unwrap();
    let session = server().session_key(&h.key).unwrap();
    h.verify_mac(&session, "POST", "/v1/jobs", 1000, 30)
        .unwrap();
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let mut accepted = 0;
    for i in 0..20_000 {
        let m = mutate(&mut rng, &seeds[i % seeds.len()]);
        decode_everything(&m);
        accepted += tensor::decode(&m).is_ok() as usize;
    }
    assert!(
        accepted > 0,
        "some mutated blobs stay valid (bit flips in the data)"
    );
}

#[test]
fn random_tensors_round_trip_through_blobs() {
    let mut rng = Rng(12345);
    for _ in 0..500 {
        let dtype = DType::ALL[rng.below(DType::ALL.len())];
        let rank = rng.below(4);
        let shape: Vec<u64> = (0..rank).map(|_| rng.below(5) as u64).collect();
        let ty = TensorType::new(dtype, shape);
        let n = ty.bytes().unwrap() as usize;
        let data: Vec<u8> = (0..n)
            .map(|_| {
                if dtype == DType::Bool {
                    rng.below(2) as u8
                } else {
                    rng.next() as u8
                }
            })
            .collect();
        let t = HostTensor::new(ty, data).unwrap();
        let blob = tensor::encode(&t);
        assert_eq!(Hash::of(&blob), tensor::hash(&t));
        let back = tensor::decode(&blob).unwrap();
        assert_eq!((back.ty(), back.bytes()), (t.ty(), t.bytes()));
    }
}
