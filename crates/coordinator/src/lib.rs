//! `tenet-coordinator`: runs each job on several independent nodes, collects their commitments
//! before any reveal, compares the results, and slashes the nodes that lied.
//!
//! This first part holds the economics that choose how often to check ([`economics`]).

pub mod economics;
