//! `tenet-coordinator`: runs each job on several independent nodes, collects their commitments
//! before any reveal, compares the results, answers with the agreed result and a receipt, and
//! slashes the nodes that lied.
//!
//! [`dispatch`] is the core (scheduling, commit-reveal across replicas, comparison per tier,
//! verdicts, slashes, receipts) over a [`tenet_ledger::Ledger`]; [`compare`] decides agreement;
//! [`economics`] prices honesty under spot-checking.

pub mod compare;
pub mod dispatch;
pub mod economics;

pub use dispatch::{Coordinator, CoordinatorConfig, DispatchError, JobOutcome, JobRequest};
