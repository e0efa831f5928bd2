//! Decoding several sequences together: one run of a batched decode graph advances every
//! member of a batch by one token, so each weight is read once for all of them.
//!
//! **A batch never changes a member's bits.** Every op of the Llama forward pass computes a
//! row from that row alone — the linear layers (`matmul` or `qmatmul`) give each output its
//! own fma chain, the norms and RoPE work per row — so the batched graph runs them over all
//! members' rows at once. Attention, the one place where a row meets its own sequence's keys
//! and values, runs over the members' caches stacked into one tensor per layer ([batch,
//! capacity, kv_heads, head_dim]), each member with its own position's masks: its products
//! are batched matmuls whose every batch entry is one member's (the same chains as alone), and
//! the rest is elementwise or per row. The logits of every member are therefore bit-identical
//! to decoding it alone, whatever joins or leaves the batch between steps: the property
//! continuous batching relies on, tested below.
//!
//! Stacking copies each cache once a step (a streaming copy, which also brings the cache into
//! the core's caches before the small attention products read it); building attention per
//! member instead cost ~20 steps a member a layer and read each cache cold, twice the time of
//! the copy and the batched steps together.
//!
//! All members run at one capacity (the largest bucket any of them needs; smaller caches are
//! grown to it, which changes no bits, see [`llama_decode_graph`]), so one compiled program
//! serves each (batch size, capacity).

use std::collections::HashMap;

use tenet_exec::Buffer;
use tenet_ir::{DType, Graph, GraphBuilder, HostTensor, Tensor, WeightsId};

use super::{DecodeSession, Llama, LlamaConfig, SmolLm2};

/// The decode graph of `batch` sequences, one new token each, at `capacity` positions.
///
/// Inputs: `ids` and `pos` (i64 [batch]: each member's token and its position) and, for each
/// member `b` and layer `l`, `cache_k{l}_{b}` / `cache_v{l}_{b}` (f32 [capacity, kv_heads,
/// head_dim], rows from the member's position on zero). Outputs: `logits` (f32 [batch,
/// vocab]), then for each member `b` and layer `l` its new rows `k{l}_{b}` and `v{l}_{b}` (f32
/// [1, kv_heads, head_dim]). Member `b`'s logits and rows are those [`llama_decode_graph`]
/// gives for it alone (see the module's header).
pub fn llama_decode_batch_graph(
    cfg: &LlamaConfig,
    weights: WeightsId,
    batch: u64,
    capacity: u64,
) -> Result<Graph, String> {
    if capacity == 0 || batch == 0 {
        return Err("a batched decode graph needs at least one member and one position".into());
    }
    let (d, nh, nkv) = (cfg.hidden, cfg.heads, cfg.kv_heads);
    let hd = d / nh;
    let g = GraphBuilder::new();
    let m = Llama::new(cfg, &g, weights);
    let (cos, sin) = m.rope_constants(0, capacity);
    let ids = g.input("ids", DType::I64, &[batch]);
    let pos = g.input("pos", DType::I64, &[batch]);
    let (c, s) = (cos.gather(&pos, 0), sin.gather(&pos, 0));
    let cache: Vec<Vec<(Tensor, Tensor)>> = (0..batch)
        .map(|b| {
            (0..cfg.layers)
                .map(|l| {
                    let shape = [capacity, nkv, hd];
                    (
                        g.input(&format!("cache_k{l}_{b}"), DType::F32, &shape),
                        g.input(&format!("cache_v{l}_{b}"), DType::F32, &shape),
                    )
                })
                .collect()
        })
        .collect();
    let x = m.embed(&ids);
    let row = g.iota(DType::I64, &[capacity], 0);
    let (zero, one) = (g.scalar(DType::F32, 0.0), g.scalar(DType::F32, 1.0));
    let lead = [batch as i64];
    let masks = m.new_row_masks(&row, &pos, &lead, capacity, &zero, &one);
    let mut new: Vec<Vec<(Tensor, Tensor)>> = vec![Vec::new(); batch as usize];
    let x = m.layers(x, batch, &c, &s, |l, q, k, v| {
        // The members' caches of this layer stacked, [batch, capacity, kv_heads, hd]: one
        // copy of each (which also brings it into cache for the products), then attention
        // over all members at once.
        let stacked = |i: usize| {
            let parts: Vec<&Tensor> = cache
                .iter()
                .map(|member| {
                    if i == 0 {
                        &member[l as usize].0
                    } else {
                        &member[l as usize].1
                    }
                })
                .collect();
            g.concat(&parts, 0)
                .reshape(&[batch as i64, capacity as i64, nkv as i64, hd as i64])
        };
        let o = m.attend(q, &k, &v, &(stacked(0), stacked(1)), &masks, &lead);
        for (b, rows) in new.iter_mut().enumerate() {
            let member = |t: &Tensor| t.slice(0, b as u64, b as u64 + 1, 1);
            rows.push((member(&k), member(&v)));
        }
        o
    });
    let h = m.rms(&x, "output_norm.weight");
    let logits = m.linear(&h, "token_embd.weight", cfg.vocab, d);
    let names: Vec<Vec<(String, String)>> = (0..batch)
        .map(|b| {
            (0..cfg.layers)
                .map(|l| (format!("k{l}_{b}"), format!("v{l}_{b}")))
                .collect()
        })
        .collect();
    let mut outputs: Vec<(&str, &Tensor)> = vec![("logits", &logits)];
    for (member_names, member_rows) in names.iter().zip(&new) {
        for ((kn, vn), (k, v)) in member_names.iter().zip(member_rows) {
            outputs.push((kn, k));
            outputs.push((vn, v));
        }
    }
    g.finish(&outputs).map_err(|e| e.to_string())
}

impl SmolLm2 {
    /// Advance every session of `sessions` by its token of `tokens` in one run of the batched
    /// decode program, and return each one's logits of the token after — bit-identical to
    /// calling [`DecodeSession::step`] on each alone. The sessions must be this model's, on
    /// one device, and hold tokens already (prefilled); members may differ in length and may
    /// change from one call to the next.
    pub fn step_batch(
        &self,
        sessions: &mut [&mut DecodeSession<'_>],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, String> {
        if sessions.len() != tokens.len() {
            return Err(format!(
                "{} sessions but {} tokens",
                sessions.len(),
                tokens.len()
            ));
        }
        match sessions {
            [] => return Ok(Vec::new()),
            [one] => return Ok(vec![one.step(tokens[0])?]),
            _ => {}
        }
        let device = sessions[0].device;
        for s in sessions.iter() {
            if !std::ptr::eq(s.model, self) {
                return Err("a session of another model cannot join this batch".into());
            }
            if s.device.id() != device.id() {
                return Err("a batch's sessions must be on one device".into());
            }
            if s.len == 0 {
                return Err("a session joins a batch after its prefill".into());
            }
        }
        // One capacity for all: the largest bucket any member needs for its next token.
        let mut capacity = 0;
        for s in sessions.iter() {
            let next = s.len + 1;
            let c = self.capacity_for(next).ok_or_else(|| {
                format!(
                    "the context of {} tokens is full: no room for token {next}",
                    self.config.context
                )
            })?;
            capacity = capacity.max(c);
        }
        // A member grown past that already (by an earlier batch) sets it.
        let capacity = sessions.iter().map(|s| s.capacity).fold(capacity, u64::max);
        for s in sessions.iter_mut() {
            s.grow_to(capacity)?;
        }
        let batch = sessions.len();
        let program = self.decode_program(device, batch as u64, capacity)?;
        let upload = |t: HostTensor| device.upload_owned(t).map_err(|e| e.to_string());
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let pos: Vec<i64> = sessions.iter().map(|s| s.len as i64).collect();
        let shape = [batch as u64];
        let mut inputs: HashMap<String, Buffer> =
            HashMap::with_capacity(2 + 2 * batch * self.config.layers as usize);
        inputs.insert(
            "ids".into(),
            upload(HostTensor::from_i64(&shape, &ids).map_err(|e| e.to_string())?)?,
        );
        inputs.insert(
            "pos".into(),
            upload(HostTensor::from_i64(&shape, &pos).map_err(|e| e.to_string())?)?,
        );
        for (b, s) in sessions.iter().enumerate() {
            for (l, (k, v)) in s.layers.iter().enumerate() {
                inputs.insert(format!("cache_k{l}_{b}"), k.clone());
                inputs.insert(format!("cache_v{l}_{b}"), v.clone());
            }
        }
        let (outputs, _) = program
            .run_buffers(&inputs, &self.weights, 0, &|| false)
            .map_err(|e| e.to_string())?;
        // The caches' handles are the sessions' alone again, so the writes are in place.
        drop(inputs);
        let mut outputs = outputs.into_iter().map(|(_, b)| b);
        let logits = outputs.next().ok_or("the graph gave no logits")?;
        for s in sessions.iter_mut() {
            let at = s.len;
            s.write_rows(&mut outputs, at)?;
            s.len = at + 1;
        }
        let logits = device
            .download(&logits)
            .map_err(|e| e.to_string())?
            .to_f32_vec();
        let vocab = self.config.vocab as usize;
        Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{tiny, tiny_quantized};
    use super::super::{WeightsMode, argmax};
    use super::*;
    use tenet_cpu::CpuDevice;

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Greedy decoding of each prompt alone: (tokens, logits per step).
    fn alone(model: &SmolLm2, dev: &CpuDevice, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
        let mut s = model.session(dev);
        let mut logits = s.prefill(prompt).unwrap();
        let mut all = vec![logits.clone()];
        for _ in 0..steps {
            logits = s.step(argmax(&logits)).unwrap();
            all.push(logits.clone());
        }
        all
    }

    /// Three sequences of different lengths (two capacity buckets) decoded together, with a
    /// member joining late and one leaving early, give each the logits of decoding it alone.
    fn batch_matches_alone(model: &SmolLm2) {
        let dev = CpuDevice::new(2, tenet_cpu::SimdLevel::detect());
        let prompts: [Vec<u32>; 3] = [
            vec![1, 2, 3],
            (0..60).map(|i| (i * 7 % 61) as u32).collect(),
            vec![5; 10],
        ];
        let steps = 8;
        let want: Vec<Vec<Vec<f32>>> = prompts
            .iter()
            .map(|p| alone(model, &dev, p, steps))
            .collect();
        let mut sessions: Vec<DecodeSession<'_>> =
            prompts.iter().map(|_| model.session(&dev)).collect();
        let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
        // Members 0 and 1 start; member 2 joins after 3 steps; member 0 leaves after 6.
        for (b, p) in prompts.iter().enumerate().take(2) {
            got[b].push(sessions[b].prefill(p).unwrap());
        }
        let mut done = [0usize; 3];
        for round in 0..(steps + 3) {
            if round == 3 {
                got[2].push(sessions[2].prefill(&prompts[2]).unwrap());
            }
            let members: Vec<usize> = (0..3)
                .filter(|&b| !got[b].is_empty() && done[b] < steps && !(b == 0 && round >= 6))
                .collect();
            if members.is_empty() {
                break;
            }
            let tokens: Vec<u32> = members
                .iter()
                .map(|&b| argmax(got[b].last().unwrap()))
                .collect();
            let mut refs: Vec<&mut DecodeSession<'_>> = sessions
                .iter_mut()
                .enumerate()
                .filter(|(b, _)| members.contains(b))
                .map(|(_, s)| s)
                .collect();
            let logits = model.step_batch(&mut refs, &tokens).unwrap();
            for (&b, l) in members.iter().zip(logits) {
                got[b].push(l);
                done[b] += 1;
            }
        }
        // Member 0 left early: finish it alone.
        while done[0] < steps {
            let next = argmax(got[0].last().unwrap());
            got[0].push(sessions[0].step(next).unwrap());
            done[0] += 1;
        }
        for b in 0..3 {
            assert_eq!(got[b].len(), want[b].len(), "member {b}");
            for (i, (g, w)) in got[b].iter().zip(&want[b]).enumerate() {
                assert!(
                    same_bits(g, w),
                    "member {b}, step {i}: logits differ from alone"
                );
            }
        }
        assert!(
            sessions[1].capacity() >= 128,
            "member 1 needed the second bucket"
        );
    }

    #[test]
    fn a_batch_gives_each_member_the_bits_of_decoding_it_alone() {
        batch_matches_alone(&tiny(256));
    }

    #[test]
    fn a_quantized_batch_gives_each_member_the_bits_of_decoding_it_alone() {
        let model = tiny_quantized(256).0;
        assert_eq!(model.mode(), WeightsMode::Quantized);
        batch_matches_alone(&model);
    }

    #[test]
    fn a_q8_batch_gives_each_member_the_bits_of_decoding_it_alone() {
        let model = super::super::tests::tiny_q8(256);
        assert_eq!(model.mode(), WeightsMode::Q8);
        batch_matches_alone(&model);
    }

    #[test]
    fn a_batch_refuses_mismatched_members() {
        let model = tiny(128);
        let dev = CpuDevice::new(1, tenet_cpu::SimdLevel::detect());
        let (mut a, mut b) = (model.session(&dev), model.session(&dev));
        a.prefill(&[1, 2]).unwrap();
        let err = model
            .step_batch(&mut [&mut a, &mut b], &[3, 4])
            .unwrap_err();
        assert!(err.contains("after its prefill"), "{err}");
        b.prefill(&[7]).unwrap();
        let err = model.step_batch(&mut [&mut a, &mut b], &[3]).unwrap_err();
        assert!(err.contains("2 sessions but 1 tokens"), "{err}");
        let other = tiny(128);
        let mut c = other.session(&dev);
        c.prefill(&[1]).unwrap();
        let err = model
            .step_batch(&mut [&mut a, &mut c], &[3, 4])
            .unwrap_err();
        assert!(err.contains("another model"), "{err}");
    }
}
