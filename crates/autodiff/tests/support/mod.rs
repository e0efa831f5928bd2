//! Support code shared by the integration tests (`mod support;`).

pub mod f64_eval;
