//! Writers of small GGUF and safetensors files, well-formed or hostile, for the tests of the
//! weights decoders and for the fuzz corpus (`weights_corpus.rs` writes the seeds with these).
// Each test binary that includes this uses some of these helpers, not all.
#![allow(dead_code)]

/// ggml type numbers.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q8_0: u32 = 8;

/// Bytes of one Q4_1 block (32 elements).
pub const Q4_1_BLOCK: usize = 20;

/// A GGUF v3 file under construction: metadata entries, tensor entries (offsets given, so they
/// may overlap), then the data section.
#[derive(Default)]
pub struct Gguf {
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

impl Gguf {
    pub fn new() -> Gguf {
        Gguf::default()
    }

    /// A metadata entry of type `ty` whose encoded value is `value`.
    pub fn meta(&mut self, key: &str, ty: u32, value: &[u8]) -> &mut Gguf {
        string(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
        self
    }

    /// An array of `n` elements of type `elem`, each encoded as `each`.
    pub fn meta_array(&mut self, key: &str, elem: u32, n: u64, each: &[u8]) -> &mut Gguf {
        let mut v = elem.to_le_bytes().to_vec();
        v.extend(n.to_le_bytes());
        for _ in 0..n {
            v.extend(each);
        }
        self.meta(key, 9, &v)
    }

    /// A tensor of row-major `shape` and ggml type `kind` at `offset` in the data section.
    pub fn tensor(&mut self, name: &str, shape: &[u64], kind: u32, offset: u64) -> &mut Gguf {
        string(&mut self.infos, name);
        self.infos.extend((shape.len() as u32).to_le_bytes());
        for d in shape.iter().rev() {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(kind.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    /// Append `bytes` to the data section; their offset.
    pub fn data(&mut self, bytes: &[u8]) -> u64 {
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        let at = self.data.len() as u64;
        self.data.extend(bytes);
        at
    }

    pub fn finish(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(self.n_tensors.to_le_bytes());
        b.extend(self.n_kv.to_le_bytes());
        b.extend(&self.kv);
        b.extend(&self.infos);
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        b.extend(&self.data);
        b
    }
}

/// `n` deterministic Q4_1 blocks (scale 1/8, offset -1).
pub fn q4_1_blocks(n: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(n * Q4_1_BLOCK);
    for i in 0..n {
        b.extend(half::f16::from_f32(0.125).to_le_bytes());
        b.extend(half::f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16).map(|j| (i * 31 + j * 7) as u8));
    }
    b
}

/// `n` deterministic Q4_0 blocks (scale 1/4; element `e < 16` of block `i` has the quantity
/// `(i + e) % 16`, element `e + 16` the quantity `15 - e`).
pub fn q4_0_blocks(n: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(n * 18);
    for i in 0..n {
        b.extend(half::f16::from_f32(0.25).to_le_bytes());
        b.extend((0..16).map(|e| ((i + e) % 16) as u8 | ((15 - e as u8) << 4)));
    }
    b
}

/// `n` deterministic Q8_0 blocks (scale 1/2, quantities `i - 16 + e`, wrapping).
pub fn q8_0_blocks(n: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(n * 34);
    for i in 0..n {
        b.extend(half::f16::from_f32(0.5).to_le_bytes());
        b.extend((0..32).map(|e| (i as i8).wrapping_add(e as i8 - 16) as u8));
    }
    b
}

/// A small valid GGUF of quantised matrices, lent as blocks: Q4_0 [2, 64], Q4_1 [3, 32],
/// Q8_0 [2, 32] and [2, 1, 32], an empty Q4_0 [0, 32]; and two that have no blocks to lend, an
/// F32 vector and a Q4_1 [2, 48] whose rows hold a block and a half (whole blocks in all, so
/// it still dequantises).
pub fn quantized_gguf() -> Vec<u8> {
    let mut g = Gguf::new();
    let at = g.data(&q4_0_blocks(4));
    g.tensor("q4_0", &[2, 64], Q4_0, at);
    let at = g.data(&q4_1_blocks(3));
    g.tensor("q4_1", &[3, 32], Q4_1, at);
    let at = g.data(&q8_0_blocks(2));
    g.tensor("q8_0", &[2, 32], Q8_0, at);
    let at = g.data(&q8_0_blocks(2));
    g.tensor("q8_0_3d", &[2, 1, 32], Q8_0, at);
    let at = g.data(&[]);
    g.tensor("empty", &[0, 32], Q4_0, at);
    let at = g.data(
        &(0..4)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect::<Vec<_>>(),
    );
    g.tensor("norm", &[4], F32, at);
    let at = g.data(&q4_1_blocks(3));
    g.tensor("straddling", &[2, 48], Q4_1, at);
    g.finish()
}

/// The amplifying file of issue 29: `tensors` Q4_1 tensors that all point at the same
/// `blocks` blocks of data. Each dequantises to `blocks × 128` bytes of f32, so the whole file
/// to `tensors × blocks × 128` bytes from about `blocks × 20` bytes of data.
pub fn q4_1_bomb(tensors: usize, blocks: usize) -> Vec<u8> {
    let mut g = Gguf::new();
    g.meta("general.architecture", 8, &{
        let mut v = Vec::new();
        string(&mut v, "llama");
        v
    });
    let at = g.data(&q4_1_blocks(blocks));
    for i in 0..tensors {
        g.tensor(&format!("blk.{i}.w"), &[blocks as u64 * 32], Q4_1, at);
    }
    g.finish()
}

/// Disjoint Q4_1 tensors, `tensors` of `blocks` blocks each: a well-formed file that
/// dequantises to `tensors × blocks × 128` bytes.
pub fn q4_1_disjoint(tensors: usize, blocks: usize) -> Vec<u8> {
    let mut g = Gguf::new();
    for i in 0..tensors {
        let at = g.data(&q4_1_blocks(blocks));
        g.tensor(&format!("blk.{i}.w"), &[blocks as u64 * 32], Q4_1, at);
    }
    g.finish()
}

/// A metadata array of `n` one-byte elements (each a 32-byte value once decoded).
pub fn metadata_bomb(n: u64) -> Vec<u8> {
    let mut g = Gguf::new();
    g.meta_array("tokenizer.ggml.bytes", 0, n, &[7]);
    g.finish()
}

/// A small valid GGUF with every dequantisable type and string metadata.
pub fn valid_gguf() -> Vec<u8> {
    let mut g = Gguf::new();
    g.meta("llama.block_count", 4, &30u32.to_le_bytes());
    g.meta_array("tokenizer.ggml.tokens", 8, 3, &{
        let mut v = Vec::new();
        string(&mut v, "ab");
        v
    });
    let f32s: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 - 2.5).to_le_bytes())
        .collect();
    let at = g.data(&f32s);
    g.tensor("w", &[2, 3], F32, at);
    let f16s: Vec<u8> = (0..4)
        .flat_map(|i| half::f16::from_f32(i as f32 * 0.5).to_le_bytes())
        .collect();
    let at = g.data(&f16s);
    g.tensor("h", &[4], F16, at);
    let mut q8 = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let at = g.data(&q8);
    g.tensor("q8", &[32], Q8_0, at);
    let at = g.data(&q4_1_blocks(2));
    g.tensor("q4", &[2, 32], Q4_1, at);
    g.finish()
}

/// A safetensors file from its JSON header (padded to 8 bytes) and data section.
pub fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend(h);
    b.extend(data);
    b
}

/// A small valid safetensors file: an f32 matrix and an i64 vector.
pub fn valid_safetensors() -> Vec<u8> {
    let mut data: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
        .collect();
    data.extend([5i64, -1].map(i64::to_le_bytes).concat());
    safetensors(
        r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"ids":{"dtype":"I64","shape":[2],"data_offsets":[24,40]}}"#,
        &data,
    )
}

/// A valid safetensors file whose f32 tensor sits at an odd offset (copied at load).
pub fn misaligned_safetensors() -> Vec<u8> {
    let mut data = vec![7u8];
    data.extend([1.5f32, -0.25].map(f32::to_le_bytes).concat());
    safetensors(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}}"#,
        &data,
    )
}

/// Two tensors over the same 16 bytes: the safetensors form of the amplifying file.
pub fn overlapping_safetensors() -> Vec<u8> {
    let data: Vec<u8> = (0..4).flat_map(|i| (i as f32).to_le_bytes()).collect();
    safetensors(
        r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        &data,
    )
}

/// One tensor whose shape lists `dims` ones: a header that costs far more memory parsed than
/// its bytes.
pub fn shape_bomb_safetensors(dims: usize) -> Vec<u8> {
    let ones = vec!["1"; dims].join(",");
    safetensors(
        &format!(r#"{{"a":{{"dtype":"U8","shape":[{ones}],"data_offsets":[0,1]}}}}"#),
        &[9],
    )
}
