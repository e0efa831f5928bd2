//! Epochs and the validators' score records. A network's spec (a JSON file every peer of the
//! network loads) fixes the genesis time, the epoch length, the validators and their stakes,
//! and the rules of settlement. Epoch `e` runs from `genesis + e·len` for `len`; its first
//! half is the commit phase, its second the reveal phase.
//!
//! Each epoch a validator challenges the hosters, then publishes on the DHT, under keys of
//! the form `/tenet/epoch/E/VALIDATOR/commit` and `…/reveal`:
//! - in the commit phase, a [`ScoreCommit`]: a hash binding its scores and a secret salt, and
//!   the hash of the seed its challenges of the *next* epoch will be drawn from;
//! - in the reveal phase, a [`ScoreReveal`]: the scores, the salt, and this epoch's seed.
//!
//! Every record is signed by the validator its key names, must be from a validator of the
//! spec, is stored only inside its phase window (by the storing peer's clock, with a small
//! allowance for skew) and expires two epochs after its epoch began. [`settle`] turns the
//! records of an epoch into each hoster's standing: reveals that do not open their commitment,
//! or whose seed is not the one committed the epoch before, are ignored; a hoster's score is
//! the stake-weighted median of the rest, decided only when validators holding more than half
//! of the stake scored it.

use std::collections::BTreeMap;
use std::path::Path;

use libp2p::PeerId;
use libp2p::kad::{Record, RecordKey};
use tenet_proto::Hash;
use tenet_proto::auth::{KeyPair, PublicKey};
use tenet_proto::commit::Sig;

use crate::advert::{MAX_RECORD_BYTES, RecordError};

/// The shortest and longest epoch a spec may set.
pub const MIN_EPOCH_MS: u64 = 1_000;
pub const MAX_EPOCH_MS: u64 = 7 * 24 * 3600 * 1000;

/// Validators one spec may name.
pub const MAX_VALIDATORS: usize = 64;

/// Hosters one validator may score in one epoch (bounds a reveal record).
pub const MAX_SCORES: usize = 128;

/// One validator and the stake that weighs its scores.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ValidatorStake {
    pub key: PublicKey,
    pub stake: u64,
}

/// What every peer of one network agrees on before it starts.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// What the operators call the network.
    pub name: String,
    /// Unix milliseconds at which epoch 0 begins.
    pub genesis_ms: u64,
    /// How long one epoch lasts.
    pub epoch_ms: u64,
    pub validators: Vec<ValidatorStake>,
    /// The stake each hoster is bonded with when a validator first sees it.
    #[serde(default = "default_hoster_stake")]
    pub hoster_stake: i64,
    /// A hoster whose settled score is below this is in bad standing: slashed, and not chosen.
    #[serde(default = "default_min_score")]
    pub min_score: f64,
    /// The share of its stake a hoster in bad standing loses each epoch.
    #[serde(default = "default_slash_fraction")]
    pub slash_fraction: f64,
    /// What a hoster in good standing is credited each epoch.
    #[serde(default = "default_epoch_reward")]
    pub epoch_reward: i64,
    /// Challenges a validator sends each hosted task each epoch.
    #[serde(default = "default_challenges")]
    pub challenges: u32,
    /// Challenge in the tolerant tier with this bound (a hoster agrees when every element of
    /// its result is within it of the element-wise median); none: the exact tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
}

fn default_hoster_stake() -> i64 {
    1000
}
fn default_min_score() -> f64 {
    0.5
}
fn default_slash_fraction() -> f64 {
    0.1
}
fn default_epoch_reward() -> i64 {
    1
}
fn default_challenges() -> u32 {
    2
}

/// Why a network spec is refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read the network spec {path}: {message}")]
    Read { path: String, message: String },
    #[error("the network spec {path} is not valid: {message}")]
    Invalid { path: String, message: String },
}

/// The two halves of an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Commit,
    Reveal,
}

impl NetworkSpec {
    /// A spec starting now-ish, for a local network.
    pub fn local(name: &str, genesis_ms: u64, epoch_ms: u64, validators: &[PublicKey]) -> Self {
        NetworkSpec {
            name: name.into(),
            genesis_ms,
            epoch_ms,
            validators: validators
                .iter()
                .map(|k| ValidatorStake {
                    key: *k,
                    stake: 100,
                })
                .collect(),
            hoster_stake: default_hoster_stake(),
            min_score: default_min_score(),
            slash_fraction: default_slash_fraction(),
            epoch_reward: default_epoch_reward(),
            challenges: default_challenges(),
            tolerance: None,
        }
    }

    /// The spec the `p2p_frames` fuzz target checks records against: one validator (key
    /// from seed 7), epochs of 10 s from time 0, and the clock at [`Self::FUZZ_NOW_MS`].
    pub fn fuzz() -> NetworkSpec {
        NetworkSpec::local("fuzz", 0, 10_000, &[KeyPair::from_seed([7; 32]).public()])
    }

    /// The fuzz target's clock: the start of an epoch (inside its commit window).
    pub const FUZZ_NOW_MS: u64 = 2_000_000_000_000;

    /// Read and check a spec file.
    pub fn load(path: &Path) -> Result<NetworkSpec, SpecError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| SpecError::Read {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        if bytes.len() > 64 << 10 {
            return Err(SpecError::Invalid {
                path: shown,
                message: "it is over 64 KiB".into(),
            });
        }
        let spec: NetworkSpec = serde_json::from_slice(&bytes).map_err(|e| SpecError::Invalid {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        spec.check().map_err(|message| SpecError::Invalid {
            path: shown,
            message,
        })?;
        Ok(spec)
    }

    /// The spec's own bounds.
    pub fn check(&self) -> Result<(), String> {
        if !(MIN_EPOCH_MS..=MAX_EPOCH_MS).contains(&self.epoch_ms) {
            return Err(format!(
                "epoch_ms is {}; it must be between {MIN_EPOCH_MS} and {MAX_EPOCH_MS}",
                self.epoch_ms
            ));
        }
        if self.validators.is_empty() || self.validators.len() > MAX_VALIDATORS {
            return Err(format!(
                "it names {} validators; between 1 and {MAX_VALIDATORS} are needed",
                self.validators.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for v in &self.validators {
            if v.stake == 0 || v.stake > 1 << 48 {
                return Err(format!(
                    "validator {} has stake {}; stakes are between 1 and 2^48",
                    v.key, v.stake
                ));
            }
            if !seen.insert(v.key) {
                return Err(format!("validator {} is named twice", v.key));
            }
        }
        if !(self.min_score > 0.0 && self.min_score <= 1.0) {
            return Err("min_score must be in (0, 1]".into());
        }
        if !(0.0..=1.0).contains(&self.slash_fraction) {
            return Err("slash_fraction must be in [0, 1]".into());
        }
        if self.hoster_stake < 0 || self.epoch_reward < 0 {
            return Err("hoster_stake and epoch_reward may not be negative".into());
        }
        if self.challenges == 0 || self.challenges > 64 {
            return Err("challenges must be between 1 and 64".into());
        }
        if self.tolerance.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
            return Err("tolerance must be a finite number, at least 0".into());
        }
        if self.name.len() > 64 {
            return Err("the name is over 64 characters".into());
        }
        Ok(())
    }

    /// The epoch under way at `now_ms` (none before genesis).
    pub fn epoch_at(&self, now_ms: u64) -> Option<u64> {
        now_ms
            .checked_sub(self.genesis_ms)
            .map(|t| t / self.epoch_ms)
    }

    /// The epoch and its phase at `now_ms`.
    pub fn phase_at(&self, now_ms: u64) -> Option<(u64, Phase)> {
        let e = self.epoch_at(now_ms)?;
        let phase = if now_ms < self.mid_ms(e) {
            Phase::Commit
        } else {
            Phase::Reveal
        };
        Some((e, phase))
    }

    pub fn start_ms(&self, epoch: u64) -> u64 {
        self.genesis_ms
            .saturating_add(epoch.saturating_mul(self.epoch_ms))
    }

    /// Where the commit phase ends and the reveal phase begins.
    pub fn mid_ms(&self, epoch: u64) -> u64 {
        self.start_ms(epoch).saturating_add(self.epoch_ms / 2)
    }

    pub fn end_ms(&self, epoch: u64) -> u64 {
        self.start_ms(epoch.saturating_add(1))
    }

    /// When an epoch's records expire: two epochs after it began.
    pub fn expiry_ms(&self, epoch: u64) -> u64 {
        self.start_ms(epoch.saturating_add(2))
    }

    /// How far apart two peers' clocks may be: a tenth of an epoch, at most two seconds.
    pub fn skew_ms(&self) -> u64 {
        (self.epoch_ms / 10).min(2_000)
    }

    /// The window a record of `kind` for `epoch` belongs to.
    pub fn window(&self, epoch: u64, kind: Phase) -> (u64, u64) {
        match kind {
            Phase::Commit => (self.start_ms(epoch), self.mid_ms(epoch)),
            Phase::Reveal => (self.mid_ms(epoch), self.end_ms(epoch)),
        }
    }

    pub fn stake_of(&self, key: &PublicKey) -> Option<u64> {
        self.validators
            .iter()
            .find(|v| v.key == *key)
            .map(|v| v.stake)
    }

    pub fn total_stake(&self) -> u64 {
        self.validators.iter().map(|v| v.stake).sum()
    }
}

/// The key of a validator's record of `kind` for `epoch`.
pub fn score_key(epoch: u64, validator: &PeerId, kind: Phase) -> RecordKey {
    let kind = match kind {
        Phase::Commit => "commit",
        Phase::Reveal => "reveal",
    };
    RecordKey::new(&format!("/tenet/epoch/{epoch}/{validator}/{kind}"))
}

/// Parse a score record's key.
fn parse_score_key(key: &str) -> Option<(u64, PeerId, Phase)> {
    let rest = key.strip_prefix("/tenet/epoch/")?;
    let mut parts = rest.split('/');
    let epoch = parts.next()?;
    if epoch.len() > 20 || epoch.starts_with('+') {
        return None;
    }
    let epoch: u64 = epoch.parse().ok()?;
    let peer: PeerId = parts.next()?.parse().ok()?;
    let kind = match parts.next()? {
        "commit" => Phase::Commit,
        "reveal" => Phase::Reveal,
        _ => return None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some((epoch, peer, kind))
}

/// A validator's commitment to its scores of one epoch.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScoreCommit {
    pub epoch: u64,
    pub validator: PublicKey,
    /// Hash of the scores and the salt ([`scores_commitment`]).
    pub commitment: Hash,
    /// Hash of the seed the next epoch's challenges are drawn from.
    pub next_seed: Hash,
    pub signed_at_ms: u64,
    pub signature: Sig,
}

/// One hoster's score from one validator.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Score {
    /// The hoster's peer id.
    pub peer: String,
    /// The share of its challenges it answered as the majority did, in [0, 1].
    pub score: f64,
    /// Challenges it was sent.
    pub challenges: u32,
}

/// A validator's scores of one epoch, opening its commitment.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScoreReveal {
    pub epoch: u64,
    pub validator: PublicKey,
    pub scores: Vec<Score>,
    /// The salt hidden in the commitment (hex).
    pub salt: String,
    /// This epoch's challenge seed (hex), committed in the previous epoch.
    pub seed: String,
    pub signed_at_ms: u64,
    pub signature: Sig,
}

/// What binds a validator to its scores before it reveals them.
pub fn scores_commitment(epoch: u64, scores: &[Score], salt: &str) -> Hash {
    let body = serde_json::json!({ "epoch": epoch, "scores": scores, "salt": salt });
    let mut text = b"tenet-scores-v1\n".to_vec();
    text.extend_from_slice(body.to_string().as_bytes());
    Hash::of(&text)
}

/// The hash a seed is committed by.
pub fn seed_commitment(seed: &[u8; 32]) -> Hash {
    let mut text = b"tenet-seed-v1\n".to_vec();
    text.extend_from_slice(seed);
    Hash::of(&text)
}

impl ScoreCommit {
    fn statement(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "epoch": self.epoch, "validator": self.validator, "commitment": self.commitment,
            "next_seed": self.next_seed, "signed_at_ms": self.signed_at_ms,
        });
        let mut out = b"tenet-score-commit-v1\n".to_vec();
        out.extend_from_slice(body.to_string().as_bytes());
        out
    }

    pub fn sign(key: &KeyPair, epoch: u64, commitment: Hash, next_seed: Hash, at_ms: u64) -> Self {
        let mut c = ScoreCommit {
            epoch,
            validator: key.public(),
            commitment,
            next_seed,
            signed_at_ms: at_ms,
            signature: Sig([0; 64]),
        };
        c.signature = Sig(key.sign(&c.statement()));
        c
    }

    pub fn verify(&self) -> bool {
        self.validator.verify(&self.statement(), &self.signature.0)
    }
}

impl ScoreReveal {
    fn statement(&self) -> Vec<u8> {
        let body = serde_json::json!({
            "epoch": self.epoch, "validator": self.validator, "scores": self.scores,
            "salt": self.salt, "seed": self.seed, "signed_at_ms": self.signed_at_ms,
        });
        let mut out = b"tenet-score-reveal-v1\n".to_vec();
        out.extend_from_slice(body.to_string().as_bytes());
        out
    }

    pub fn sign(
        key: &KeyPair,
        epoch: u64,
        scores: Vec<Score>,
        salt: String,
        seed: String,
        at_ms: u64,
    ) -> Self {
        let mut r = ScoreReveal {
            epoch,
            validator: key.public(),
            scores,
            salt,
            seed,
            signed_at_ms: at_ms,
            signature: Sig([0; 64]),
        };
        r.signature = Sig(key.sign(&r.statement()));
        r
    }

    pub fn verify(&self) -> bool {
        self.validator.verify(&self.statement(), &self.signature.0)
    }

    /// Whether these scores are the ones `commit` bound.
    pub fn opens(&self, commit: &ScoreCommit) -> bool {
        commit.epoch == self.epoch
            && commit.validator == self.validator
            && scores_commitment(self.epoch, &self.scores, &self.salt) == commit.commitment
    }

    /// Whether the seed revealed is the one `previous` (the validator's commitment of the
    /// epoch before) named.
    pub fn seed_matches(&self, previous: &ScoreCommit) -> bool {
        tenet_proto::from_hex(&self.seed)
            .and_then(|s| <[u8; 32]>::try_from(s).ok())
            .is_some_and(|s| seed_commitment(&s) == previous.next_seed)
    }
}

/// A checked score record.
#[derive(Clone, Debug, PartialEq)]
pub enum ScoreRecord {
    Commit(ScoreCommit),
    Reveal(ScoreReveal),
}

impl ScoreRecord {
    pub fn epoch(&self) -> u64 {
        match self {
            ScoreRecord::Commit(c) => c.epoch,
            ScoreRecord::Reveal(r) => r.epoch,
        }
    }

    pub fn validator(&self) -> PublicKey {
        match self {
            ScoreRecord::Commit(c) => c.validator,
            ScoreRecord::Reveal(r) => r.validator,
        }
    }

    /// The DHT record, under its key, expiring with its epoch.
    pub fn record(&self, spec: &NetworkSpec, now_ms: u64) -> Option<Record> {
        let peer = crate::keys::peer_id(&self.validator())?;
        let (kind, value) = match self {
            ScoreRecord::Commit(c) => (Phase::Commit, serde_json::to_vec(c).ok()?),
            ScoreRecord::Reveal(r) => (Phase::Reveal, serde_json::to_vec(r).ok()?),
        };
        let mut record = Record::new(score_key(self.epoch(), &peer, kind), value);
        record.publisher = Some(peer);
        let left = spec.expiry_ms(self.epoch()).saturating_sub(now_ms);
        record.expires = Some(std::time::Instant::now() + std::time::Duration::from_millis(left));
        Some(record)
    }
}

/// Whether a record is being stored (its phase window applies) or read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    Store,
    Read,
}

/// Whether a record key is a score record's.
pub fn is_score_key(key: &RecordKey) -> bool {
    key.as_ref().starts_with(b"/tenet/epoch/")
}

/// Check a score record: its key, size, author (a validator of `spec`, the one its key
/// names), signature, the time it says it was signed (inside its window), and — when it is
/// being stored — the storing peer's clock (inside its window, before its expiry).
pub fn check_score_record(
    record: &Record,
    spec: Option<&NetworkSpec>,
    now_ms: u64,
    usage: Use,
) -> Result<ScoreRecord, RecordError> {
    let key = std::str::from_utf8(record.key.as_ref()).map_err(|_| RecordError::Key)?;
    let (epoch, peer, kind) = parse_score_key(key).ok_or(RecordError::Key)?;
    if record.value.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge(record.value.len()));
    }
    let spec = spec.ok_or(RecordError::NoNetwork)?;
    let parsed = match kind {
        Phase::Commit => ScoreRecord::Commit(
            serde_json::from_slice(&record.value).map_err(|e| RecordError::Parse(e.to_string()))?,
        ),
        Phase::Reveal => {
            let r: ScoreReveal = serde_json::from_slice(&record.value)
                .map_err(|e| RecordError::Parse(e.to_string()))?;
            if r.scores.len() > MAX_SCORES
                || r.scores.iter().any(|s| {
                    s.peer.len() > 64 || !(0.0..=1.0).contains(&s.score) || s.challenges > 4096
                })
                || r.salt.len() != 64
                || r.seed.len() != 64
            {
                return Err(RecordError::Bounds);
            }
            ScoreRecord::Reveal(r)
        }
    };
    if parsed.epoch() != epoch {
        return Err(RecordError::Key);
    }
    let validator = parsed.validator();
    if crate::keys::peer_id(&validator) != Some(peer) {
        return Err(RecordError::WrongSigner);
    }
    if spec.stake_of(&validator).is_none() {
        return Err(RecordError::NotValidator);
    }
    let verified = match &parsed {
        ScoreRecord::Commit(c) => c.verify(),
        ScoreRecord::Reveal(r) => r.verify(),
    };
    if !verified {
        return Err(RecordError::Signature);
    }
    let (from, to) = spec.window(epoch, kind);
    let skew = spec.skew_ms();
    let signed = match &parsed {
        ScoreRecord::Commit(c) => c.signed_at_ms,
        ScoreRecord::Reveal(r) => r.signed_at_ms,
    };
    let inside = |t: u64| t + skew >= from && t < to + skew;
    if !inside(signed) {
        return Err(RecordError::Window);
    }
    match usage {
        Use::Store if !inside(now_ms) => Err(RecordError::Window),
        _ if now_ms >= spec.expiry_ms(epoch) => Err(RecordError::Expired),
        _ => Ok(parsed),
    }
}

/// A hoster's standing after one epoch.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Standing {
    pub peer: String,
    /// The stake-weighted median of the counted validators' scores.
    pub score: f64,
    /// The stake of the validators that scored it.
    pub scored_by_stake: u64,
    /// Whether validators with more than half of the stake scored it.
    pub decided: bool,
    /// Decided, and at least the spec's `min_score`.
    pub good: bool,
}

/// How an epoch settled.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Settled {
    pub epoch: u64,
    /// Validators whose reveals counted.
    pub counted: Vec<PublicKey>,
    /// Validators whose reveals were ignored, and why.
    pub ignored: Vec<(PublicKey, String)>,
    pub standings: Vec<Standing>,
}

impl Settled {
    pub fn standing(&self, peer: &PeerId) -> Option<&Standing> {
        let peer = peer.to_string();
        self.standings.iter().find(|s| s.peer == peer)
    }

    /// Whether `peer` is in bad standing (decided and below the bar).
    pub fn is_bad(&self, peer: &PeerId) -> bool {
        self.standing(peer).is_some_and(|s| s.decided && !s.good)
    }
}

/// Settle `epoch` from its records: `commits` and `reveals` of this epoch, `previous` the
/// commitments of the epoch before (for the seeds). Only validators of the spec count; of
/// each, one commitment and one reveal.
pub fn settle(
    spec: &NetworkSpec,
    epoch: u64,
    commits: &[ScoreCommit],
    reveals: &[ScoreReveal],
    previous: &[ScoreCommit],
) -> Settled {
    let mut counted = Vec::new();
    let mut ignored = Vec::new();
    let mut by_hoster: BTreeMap<String, Vec<(f64, u64)>> = BTreeMap::new();
    for v in &spec.validators {
        let distinct_commits = commits
            .iter()
            .filter(|c| c.validator == v.key && c.epoch == epoch)
            .map(|c| c.commitment)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let distinct_reveals = reveals
            .iter()
            .filter(|r| r.validator == v.key && r.epoch == epoch)
            .map(|r| scores_commitment(epoch, &r.scores, &r.salt))
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        if distinct_commits > 1 || distinct_reveals > 1 {
            ignored.push((
                v.key,
                "it signed two different records for the epoch".into(),
            ));
            continue;
        }
        let reveal = reveals
            .iter()
            .find(|r| r.validator == v.key && r.epoch == epoch);
        let commit = commits
            .iter()
            .find(|c| c.validator == v.key && c.epoch == epoch);
        let Some(reveal) = reveal else {
            if commit.is_some() {
                ignored.push((v.key, "it committed and did not reveal".into()));
            }
            continue;
        };
        let Some(commit) = commit else {
            ignored.push((v.key, "it revealed without a commitment".into()));
            continue;
        };
        if !reveal.opens(commit) {
            ignored.push((
                v.key,
                "its revealed scores are not the ones it committed to".into(),
            ));
            continue;
        }
        let before = previous
            .iter()
            .find(|c| c.validator == v.key && c.epoch + 1 == epoch);
        if let Some(before) = before
            && !reveal.seed_matches(before)
        {
            ignored.push((
                v.key,
                "its challenge seed is not the one it committed to the epoch before".into(),
            ));
            continue;
        }
        counted.push(v.key);
        let mut seen = std::collections::BTreeSet::new();
        for s in &reveal.scores {
            // One score per hoster per validator: a repeated peer counts once.
            if seen.insert(s.peer.clone()) {
                by_hoster
                    .entry(s.peer.clone())
                    .or_default()
                    .push((s.score, v.stake));
            }
        }
    }
    let total = spec.total_stake();
    let standings = by_hoster
        .into_iter()
        .map(|(peer, mut scores)| {
            let scored_by_stake: u64 = scores.iter().map(|(_, w)| w).sum();
            let score = weighted_median(&mut scores);
            let decided = scored_by_stake * 2 > total;
            Standing {
                peer,
                score,
                scored_by_stake,
                decided,
                good: decided && score >= spec.min_score,
            }
        })
        .collect();
    Settled {
        epoch,
        counted,
        ignored,
        standings,
    }
}

/// The lower stake-weighted median: the least score at which the weight at or below it
/// reaches half the total.
fn weighted_median(scores: &mut [(f64, u64)]) -> f64 {
    scores.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = scores.iter().map(|(_, w)| w).sum();
    let mut acc = 0;
    for (s, w) in scores.iter() {
        acc += w;
        if acc * 2 >= total {
            return *s;
        }
    }
    0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u8) -> Vec<KeyPair> {
        (1..=n).map(|i| KeyPair::from_seed([i; 32])).collect()
    }

    fn spec(vs: &[KeyPair]) -> NetworkSpec {
        let pubs: Vec<PublicKey> = vs.iter().map(|k| k.public()).collect();
        NetworkSpec::local("t", 1_000_000, 10_000, &pubs)
    }

    fn scores(liar: &str, liar_score: f64) -> Vec<Score> {
        vec![
            Score {
                peer: "honest".into(),
                score: 1.0,
                challenges: 2,
            },
            Score {
                peer: liar.into(),
                score: liar_score,
                challenges: 2,
            },
        ]
    }

    fn publish(
        k: &KeyPair,
        epoch: u64,
        s: Vec<Score>,
        seed: [u8; 32],
        next: [u8; 32],
    ) -> (ScoreCommit, ScoreReveal) {
        let salt = tenet_proto::to_hex(&[epoch as u8; 32]);
        let c = ScoreCommit::sign(
            k,
            epoch,
            scores_commitment(epoch, &s, &salt),
            seed_commitment(&next),
            0,
        );
        let r = ScoreReveal::sign(k, epoch, s, salt, tenet_proto::to_hex(&seed), 0);
        (c, r)
    }

    #[test]
    fn epochs_and_their_windows() {
        let s = spec(&keys(1));
        assert_eq!(s.epoch_at(999_999), None);
        assert_eq!(s.phase_at(1_000_000), Some((0, Phase::Commit)));
        assert_eq!(s.phase_at(1_004_999), Some((0, Phase::Commit)));
        assert_eq!(s.phase_at(1_005_000), Some((0, Phase::Reveal)));
        assert_eq!(s.phase_at(1_010_000), Some((1, Phase::Commit)));
        assert_eq!(s.window(1, Phase::Reveal), (1_015_000, 1_020_000));
        assert_eq!(s.expiry_ms(1), 1_030_000);
        assert!(s.check().is_ok());
        let mut bad = s.clone();
        bad.epoch_ms = 10;
        assert!(bad.check().is_err());
        bad = s.clone();
        bad.validators.push(bad.validators[0].clone());
        assert!(bad.check().unwrap_err().contains("twice"));
    }

    #[test]
    fn records_only_in_their_window_from_their_validator() {
        let vs = keys(2);
        let s = spec(&vs);
        let (c, r) = publish(&vs[0], 1, scores("liar", 0.0), [1; 32], [2; 32]);
        let c = ScoreCommit::sign(&vs[0], 1, c.commitment, c.next_seed, 1_011_000);
        let r = ScoreReveal::sign(&vs[0], 1, r.scores, r.salt, r.seed, 1_016_000);
        let commit = ScoreRecord::Commit(c.clone())
            .record(&s, 1_011_000)
            .unwrap();
        let reveal = ScoreRecord::Reveal(r.clone())
            .record(&s, 1_016_000)
            .unwrap();
        let check = |rec: &Record, now, u| check_score_record(rec, Some(&s), now, u);
        assert_eq!(
            check(&commit, 1_012_000, Use::Store),
            Ok(ScoreRecord::Commit(c.clone()))
        );
        // Out of its window: a commitment in the reveal phase, a reveal in the commit phase.
        assert_eq!(
            check(&commit, 1_017_000, Use::Store),
            Err(RecordError::Window)
        );
        assert_eq!(
            check(&reveal, 1_012_000, Use::Store),
            Err(RecordError::Window)
        );
        assert!(check(&reveal, 1_016_500, Use::Store).is_ok());
        // Read back later it still counts, until it expires two epochs after its own.
        assert!(check(&commit, 1_025_000, Use::Read).is_ok());
        assert_eq!(
            check(&commit, 1_030_000, Use::Read),
            Err(RecordError::Expired)
        );
        // Dated out of its window by its own signature: refused even when read.
        let late = ScoreCommit::sign(&vs[0], 1, c.commitment, c.next_seed, 1_017_000);
        let late = ScoreRecord::Commit(late).record(&s, 1_017_000).unwrap();
        assert_eq!(check(&late, 1_018_000, Use::Read), Err(RecordError::Window));
        // Signed by another validator under this one's key, by a non-validator, unsigned.
        let mut forged = commit.clone();
        forged.value = serde_json::to_vec(&ScoreCommit::sign(
            &vs[1],
            1,
            c.commitment,
            c.next_seed,
            1_011_000,
        ))
        .unwrap();
        assert_eq!(
            check(&forged, 1_012_000, Use::Store),
            Err(RecordError::WrongSigner)
        );
        let outsider = KeyPair::from_seed([9; 32]);
        let theirs = ScoreRecord::Commit(ScoreCommit::sign(
            &outsider,
            1,
            c.commitment,
            c.next_seed,
            1_011_000,
        ))
        .record(&s, 1_011_000)
        .unwrap();
        assert_eq!(
            check(&theirs, 1_012_000, Use::Store),
            Err(RecordError::NotValidator)
        );
        let mut unsigned = c.clone();
        unsigned.signature = Sig([0; 64]);
        let mut rec = commit.clone();
        rec.value = serde_json::to_vec(&unsigned).unwrap();
        assert_eq!(
            check(&rec, 1_012_000, Use::Store),
            Err(RecordError::Signature)
        );
        // Another epoch's record under this epoch's key; no network spec at all.
        let mut moved = commit.clone();
        moved.key = score_key(
            2,
            &crate::keys::peer_id(&vs[0].public()).unwrap(),
            Phase::Commit,
        );
        assert_eq!(check(&moved, 1_012_000, Use::Read), Err(RecordError::Key));
        assert_eq!(
            check_score_record(&commit, None, 1_012_000, Use::Store),
            Err(RecordError::NoNetwork)
        );
    }

    #[test]
    fn settlement_is_stake_weighted_and_ignores_validators_that_change_their_scores() {
        let vs = keys(3);
        let s = spec(&vs);
        let mut commits = Vec::new();
        let mut reveals = Vec::new();
        let mut previous = Vec::new();
        for (i, k) in vs.iter().enumerate() {
            let (p, _) = publish(k, 4, vec![], [0; 32], [i as u8 + 10; 32]);
            previous.push(p);
            let (c, r) = publish(k, 5, scores("liar", 0.0), [i as u8 + 10; 32], [0; 32]);
            commits.push(c);
            reveals.push(r);
        }
        let settled = settle(&s, 5, &commits, &reveals, &previous);
        assert_eq!(settled.counted.len(), 3);
        let liar = settled.standings.iter().find(|x| x.peer == "liar").unwrap();
        assert!(liar.decided && !liar.good && liar.score == 0.0);
        assert!(
            settled
                .standings
                .iter()
                .find(|x| x.peer == "honest")
                .unwrap()
                .good
        );

        // The third validator reveals scores other than those it committed to (vouching for
        // the liar): it is ignored, and the other two still decide.
        let mut changed = reveals.clone();
        changed[2] = ScoreReveal::sign(
            &vs[2],
            5,
            scores("liar", 1.0),
            reveals[2].salt.clone(),
            reveals[2].seed.clone(),
            0,
        );
        let settled = settle(&s, 5, &commits, &changed, &previous);
        assert_eq!(settled.counted.len(), 2);
        assert_eq!(settled.ignored.len(), 1);
        assert_eq!(settled.ignored[0].0, vs[2].public());
        let liar = settled.standings.iter().find(|x| x.peer == "liar").unwrap();
        assert!(liar.decided && !liar.good);

        // A seed other than the one committed the epoch before: ignored too.
        let mut reseeded = reveals.clone();
        reseeded[1] = ScoreReveal::sign(
            &vs[1],
            5,
            reveals[1].scores.clone(),
            reveals[1].salt.clone(),
            tenet_proto::to_hex(&[99; 32]),
            0,
        );
        let settled = settle(&s, 5, &commits, &reseeded, &previous);
        assert!(settled.ignored[0].1.contains("seed"));

        // A validator that signed two commitments for the epoch is ignored.
        let mut twice = commits.clone();
        twice.push(ScoreCommit::sign(
            &vs[0],
            5,
            Hash::of(b"other"),
            Hash::of(b"s"),
            0,
        ));
        let settled = settle(&s, 5, &twice, &reveals, &previous);
        assert_eq!(settled.ignored.len(), 1);
        assert!(settled.ignored[0].1.contains("two different"));

        // One honest validator of three alone cannot decide: a third of the stake.
        let settled = settle(&s, 5, &commits[..1], &reveals[..1], &previous);
        assert!(settled.standings.iter().all(|x| !x.decided));

        // Stake weighs: a validator holding most of the stake outweighs two vouching ones.
        let mut heavy = s.clone();
        heavy.validators[0].stake = 1000;
        let mut vouch = reveals.clone();
        let mut vouch_commits = commits.clone();
        for i in 1..3 {
            let (c, r) = publish(&vs[i], 5, scores("liar", 1.0), [i as u8 + 10; 32], [0; 32]);
            vouch_commits[i] = c;
            vouch[i] = r;
        }
        let settled = settle(&heavy, 5, &vouch_commits, &vouch, &previous);
        assert!(settled.is_bad_named("liar"));
        let settled = settle(&s, 5, &vouch_commits, &vouch, &previous);
        assert!(!settled.is_bad_named("liar"));
    }

    impl Settled {
        fn is_bad_named(&self, peer: &str) -> bool {
            self.standings
                .iter()
                .any(|s| s.peer == peer && s.decided && !s.good)
        }
    }
}
