//! One suite, every backend: the same checks run on SQLite (always) and on PostgreSQL (when
//! TENET_TEST_POSTGRES_URL names a server that lets the test create a database; `.ci/run`
//! starts one on 127.0.0.1).

use tenet_ledger::{
    AssignmentState, JobRecord, JobState, Ledger, LedgerError, NodeRecord, NodeState, Settlement,
    SqlLedger, Verdict,
};

fn node(id: &str, stake: i64) -> NodeRecord {
    NodeRecord {
        id: id.into(),
        url: format!("http://127.0.0.1:1/{id}"),
        stake,
        state: NodeState::Registered,
        registered_at: 10,
        last_heartbeat: 10,
        agreed: 0,
        disagreed: 0,
        score_sum: 0.0,
        operator: String::new(),
        memory_limit: 0,
        max_flops: 0,
        device: "cpu".into(),
        exact: true,
    }
}

fn job(id: &str, created_at: i64) -> JobRecord {
    JobRecord {
        id: id.into(),
        task: "t".repeat(64),
        weights: None,
        inputs: r#"{"x":"00"}"#.into(),
        tier: "exact".into(),
        seed: 7,
        replicas: 3,
        state: JobState::Pending,
        created_at,
        updated_at: created_at,
        output_hash: None,
        receipt: None,
        error: None,
    }
}

/// Two futures run at once (the suite has no futures crate).
async fn futures_like_join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    tokio::join!(a, b)
}

fn conflict<T: std::fmt::Debug>(r: Result<T, LedgerError>) {
    assert!(
        matches!(r, Err(LedgerError::Conflict(_))),
        "expected a conflict, got {r:?}"
    );
}

/// The suite. `reopen` connects again to the same database (a coordinator restart).
async fn suite(l: &SqlLedger, reopen: impl AsyncFn() -> SqlLedger) {
    assert_eq!(l.schema_version().await.unwrap(), 4);
    // Nodes: register, refuse duplicates, heartbeat, states, re-register after leaving.
    for (id, stake) in [("a", 1000), ("b", 1000), ("c", 700)] {
        l.register_node(&node(id, stake)).await.unwrap();
    }
    conflict(l.register_node(&node("a", 5)).await);
    l.set_node_state("a", NodeState::Active).await.unwrap();
    l.heartbeat("a", 99).await.unwrap();
    assert!(matches!(
        l.heartbeat("zz", 1).await,
        Err(LedgerError::NotFound(_))
    ));
    let a = l.node("a").await.unwrap().unwrap();
    assert_eq!(
        (a.state, a.last_heartbeat, a.stake),
        (NodeState::Active, 99, 1000)
    );
    l.set_node_state("c", NodeState::Deregistered)
        .await
        .unwrap();
    // Coming back keeps the stake it had, whatever the registration claims.
    let mut back = node("c", 1_000_000_000_000_000);
    back.url = "http://127.0.0.1:2/c".into();
    l.register_node(&back).await.unwrap();
    let c = l.node("c").await.unwrap().unwrap();
    assert_eq!((c.stake, c.url.as_str()), (700, "http://127.0.0.1:2/c"));
    assert_eq!(l.nodes().await.unwrap().len(), 3);

    // A job and its state machine.
    let nodes: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    l.create_job(&job("j1", 100), &nodes).await.unwrap();
    conflict(l.create_job(&job("j1", 100), &nodes).await);
    l.advance_job("j1", JobState::Pending, JobState::Committing, 101)
        .await
        .unwrap();
    conflict(
        l.advance_job("j1", JobState::Pending, JobState::Committing, 102)
            .await,
    );
    assert!(matches!(
        l.advance_job("nope", JobState::Pending, JobState::Committing, 1)
            .await,
        Err(LedgerError::NotFound(_))
    ));
    conflict(l.record_reveal("j1", "a", "h", "s").await); // no reveal before the commitment
    l.record_commitment("j1", "a", "{\"node\":\"a\"}")
        .await
        .unwrap();
    conflict(l.record_commitment("j1", "a", "again").await);
    let rest = [("b", "{\"node\":\"b\"}"), ("c", "{\"node\":\"c\"}")]
        .map(|(n, c)| (n.to_string(), c.to_string()));
    conflict(
        l.record_commitments("j1", &[rest[0].clone(), ("a".into(), "again".into())], 103)
            .await,
    );
    assert_eq!(
        l.assignments("j1").await.unwrap()[1].state,
        AssignmentState::Assigned,
        "a refused batch records nothing"
    );
    l.record_commitments("j1", &rest, 103).await.unwrap();
    assert_eq!(
        l.job("j1").await.unwrap().unwrap().state,
        JobState::Revealing,
        "the last commitments move the job on"
    );
    conflict(l.record_commitments("j1", &[], 103).await);
    l.record_reveal("j1", "a", "good", "s1").await.unwrap();
    l.record_reveal("j1", "b", "good", "s2").await.unwrap();
    let asg = l.assignments("j1").await.unwrap();
    assert_eq!(asg.len(), 3);
    assert_eq!(
        asg.iter().map(|a| a.state).collect::<Vec<_>>(),
        [
            AssignmentState::Revealed,
            AssignmentState::Revealed,
            AssignmentState::Committed
        ]
    );
    assert_eq!(asg[0].commitment.as_deref(), Some("{\"node\":\"a\"}"));
    assert_eq!(asg[2].commitment.as_deref(), Some("{\"node\":\"c\"}"));
    assert_eq!(l.unfinished_jobs().await.unwrap().len(), 1);
    let verdicts = [
        Verdict {
            node_id: "a".into(),
            agreed: true,
            score: 1.0,
            withheld: false,
        },
        Verdict {
            node_id: "b".into(),
            agreed: true,
            score: 1.0,
            withheld: false,
        },
        Verdict {
            node_id: "c".into(),
            agreed: false,
            score: 0.0,
            withheld: false,
        },
    ];
    let reveals = [("c".to_string(), "evil".to_string(), "s3".to_string())];
    let settle = |receipt, at| Settlement {
        output_hash: "good",
        receipt,
        reveals: &reveals,
        verdicts: &verdicts,
        slash_fraction: 0.5,
        reward: 10,
        at,
    };
    conflict(
        l.decide_job(
            "j1",
            &Settlement {
                slash_fraction: 1.5,
                ..settle("{}", 104)
            },
        )
        .await,
    );
    assert_eq!(
        l.job("j1").await.unwrap().unwrap().state,
        JobState::Revealing,
        "a refused settlement changes nothing"
    );
    assert_eq!(
        l.decide_job("j1", &settle("{\"receipt\":1}", 104))
            .await
            .unwrap(),
        [("c".to_string(), 350)],
        "the liar loses half its 700, in the same transaction as the decision"
    );
    conflict(l.decide_job("j1", &settle("{}", 105)).await);
    conflict(l.fail_job("j1", "late", 105).await);
    let j = l.job("j1").await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Decided);
    assert_eq!(j.output_hash.as_deref(), Some("good"));
    assert_eq!(j.receipt.as_deref(), Some("{\"receipt\":1}"));
    let c = l.node("c").await.unwrap().unwrap();
    assert_eq!((c.agreed, c.disagreed, c.score()), (0, 1, 0.0));
    assert_eq!(l.node("a").await.unwrap().unwrap().score(), 1.0);
    assert!(l.unfinished_jobs().await.unwrap().is_empty());
    let asg = l.assignments("j1").await.unwrap();
    assert_eq!(asg[2].state, AssignmentState::Disagreed);
    assert_eq!(
        (asg[2].output_hash.as_deref(), asg[2].salt.as_deref()),
        (Some("evil"), Some("s3")),
        "the settlement recorded the last reveal"
    );

    assert_eq!(l.node("a").await.unwrap().unwrap().stake, 1010);
    assert_eq!(l.node("b").await.unwrap().unwrap().stake, 1010);

    // Slashes and credits.
    assert_eq!(
        l.slash("c", "j1", 0.3, "disagreed", 107).await.unwrap(),
        105
    );
    l.credit("a", "j1", 10, 108).await.unwrap();
    assert_eq!(l.node("c").await.unwrap().unwrap().stake, 245);
    assert_eq!(l.node("a").await.unwrap().unwrap().stake, 1020);
    let ev = l.stake_events("c").await.unwrap();
    assert_eq!(
        ev.iter().map(|e| e.delta).collect::<Vec<_>>(),
        [700, -350, -105]
    );
    assert_eq!(
        (ev[0].job_id.as_deref(), ev[0].reason.as_str()),
        (None, tenet_ledger::BONDED)
    );
    assert_eq!(ev[1].job_id.as_deref(), Some("j1"));
    assert_eq!(ev[1].reason, tenet_ledger::DISAGREED);
    conflict(l.slash("c", "j1", 1.5, "bad", 1).await);
    assert!(matches!(
        l.slash("zz", "j1", 0.5, "x", 1).await,
        Err(LedgerError::NotFound(_))
    ));

    // Failing jobs and replicas; rescheduling onto another node.
    l.create_job(&job("j2", 200), &nodes[..2]).await.unwrap();
    l.advance_job("j2", JobState::Pending, JobState::Committing, 201)
        .await
        .unwrap();
    l.fail_assignment("j2", "b").await.unwrap();
    conflict(l.fail_assignment("j2", "b").await);
    l.assign("j2", "c").await.unwrap();
    conflict(l.assign("j2", "c").await);
    assert_eq!(l.assignments("j2").await.unwrap().len(), 3);
    l.create_job(&job("j3", 300), &nodes[..1]).await.unwrap();
    l.fail_job("j3", "no nodes answered", 301).await.unwrap();
    assert_eq!(
        l.job("j3").await.unwrap().unwrap().error.as_deref(),
        Some("no nodes answered")
    );
    let listed: Vec<String> = l.jobs(2).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(listed, ["j3", "j2"], "newest first, limited");

    // Concurrent slashes from many tasks: every one lands, none is lost.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            l.slash("a", &format!("k{i}"), 0.01, "load", 400)
                .await
                .unwrap()
        }));
    }
    let mut taken = 0;
    for t in tasks {
        taken += t.await.unwrap();
    }
    assert_eq!(l.node("a").await.unwrap().unwrap().stake, 1020 - taken);
    assert_eq!(l.stake_events("a").await.unwrap().len(), 23);

    // Bonds: only through `bond`, never below zero, with an event and an operator.
    let b = l.bond("b", 500, Some("alice"), 500).await.unwrap();
    assert_eq!(
        (b.stake, b.operator.as_str(), b.party()),
        (1510, "alice", "alice")
    );
    let b = l.bond("b", -10, None, 501).await.unwrap();
    assert_eq!((b.stake, b.operator.as_str()), (1500, "alice"));
    conflict(l.bond("b", -1501, None, 502).await);
    conflict(l.bond("b", i64::MAX, None, 502).await);
    assert_eq!(l.node("b").await.unwrap().unwrap().stake, 1500);
    assert!(matches!(
        l.bond("zz", 1, None, 1).await,
        Err(LedgerError::NotFound(_))
    ));
    let ev = l.stake_events("b").await.unwrap();
    let last: Vec<(i64, &str)> = ev[ev.len() - 2..]
        .iter()
        .map(|e| (e.delta, e.reason.as_str()))
        .collect();
    assert_eq!(
        last,
        [(500, tenet_ledger::BONDED), (-10, tenet_ledger::UNBONDED)]
    );
    assert_eq!(l.node("a").await.unwrap().unwrap().party(), "a");
    l.set_node_limits(
        "b",
        &tenet_ledger::NodeLimits {
            memory_limit: 1 << 30,
            max_flops: 1_000_000,
            device: "gpu opencl:0".into(),
            exact: false,
        },
    )
    .await
    .unwrap();
    let b = l.node("b").await.unwrap().unwrap();
    assert_eq!((b.memory_limit, b.max_flops), (1 << 30, 1_000_000));
    assert_eq!((b.device.as_str(), b.exact), ("gpu opencl:0", false));
    assert!(l.node("a").await.unwrap().unwrap().exact);

    // A replica that committed and withheld its reveal is slashed with its own reason.
    l.create_job(&job("j4", 400), &nodes[..2]).await.unwrap();
    l.record_commitments(
        "j4",
        &[("a".into(), "{}".into()), ("b".into(), "{}".into())],
        401,
    )
    .await
    .unwrap();
    let verdicts = [
        Verdict {
            node_id: "a".into(),
            agreed: true,
            score: 1.0,
            withheld: false,
        },
        Verdict {
            node_id: "b".into(),
            agreed: false,
            score: 0.0,
            withheld: true,
        },
    ];
    let slashed = l
        .decide_job(
            "j4",
            &Settlement {
                output_hash: "good",
                receipt: "{}",
                reveals: &[],
                verdicts: &verdicts,
                slash_fraction: 0.1,
                reward: 0,
                at: 402,
            },
        )
        .await
        .unwrap();
    assert_eq!(slashed, [("b".to_string(), 150)]);
    let ev = l.stake_events("b").await.unwrap();
    let last = ev.last().unwrap();
    assert_eq!(
        (last.delta, last.reason.as_str(), last.job_id.as_deref()),
        (-150, tenet_ledger::WITHHELD, Some("j4"))
    );

    // A job's stake events by the job: j4's slash of b, and nothing of another job's.
    let by_job = l.job_stake_events("j4").await.unwrap();
    assert!(by_job.iter().all(|e| e.job_id.as_deref() == Some("j4")));
    let slashes: Vec<(&str, i64)> = by_job
        .iter()
        .filter(|e| e.delta < 0)
        .map(|e| (e.node_id.as_str(), e.delta))
        .collect();
    assert_eq!(slashes, [("b", -150)]);
    assert!(l.job_stake_events("no-such-job").await.unwrap().is_empty());

    // Idempotency keys: the first job tied to a key keeps it, on every ledger handle; racing
    // claims agree on one winner.
    assert_eq!(
        l.claim_idempotency_key("k1", "j1", 500).await.unwrap(),
        "j1"
    );
    assert_eq!(
        l.claim_idempotency_key("k1", "j9", 501).await.unwrap(),
        "j1"
    );
    let other = reopen().await;
    assert_eq!(
        other.claim_idempotency_key("k1", "j8", 502).await.unwrap(),
        "j1"
    );
    let racing = futures_like_join(
        l.claim_idempotency_key("k2", "jA", 503),
        other.claim_idempotency_key("k2", "jB", 503),
    )
    .await;
    assert_eq!(racing.0.as_ref().unwrap(), racing.1.as_ref().unwrap());
    assert!(["jA", "jB"].contains(&racing.0.unwrap().as_str()));
    // A key whose job was never created is taken over once, by one claimant.
    assert_eq!(
        l.claim_idempotency_key("k3", "ghost", 504).await.unwrap(),
        "ghost"
    );
    assert!(
        l.take_over_idempotency_key("k3", "ghost", "jC")
            .await
            .unwrap()
    );
    assert!(
        !other
            .take_over_idempotency_key("k3", "ghost", "jD")
            .await
            .unwrap()
    );
    assert_eq!(
        l.claim_idempotency_key("k3", "jE", 505).await.unwrap(),
        "jC"
    );

    // Everything is still there after reconnecting (a restart), and j2 is still unfinished.
    let again = reopen().await;
    assert_eq!(
        again.schema_version().await.unwrap(),
        4,
        "migrations are not re-applied"
    );
    assert_eq!(again.node("c").await.unwrap().unwrap().stake, 245);
    let unfinished: Vec<String> = again
        .unfinished_jobs()
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(unfinished, ["j2"]);
    assert_eq!(
        again.job("j1").await.unwrap().unwrap().state,
        JobState::Decided
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let l = SqlLedger::connect(&url).await.unwrap();
    assert_eq!(l.dialect_name(), "sqlite");
    suite(&l, async || SqlLedger::connect(&url).await.unwrap()).await;
    let mode: String = l.journal_mode().await.unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    let Ok(admin) = std::env::var("TENET_TEST_POSTGRES_URL") else {
        eprintln!(
            "SKIPPED: set TENET_TEST_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/postgres) to run the ledger suite on PostgreSQL; .ci/run does"
        );
        return;
    };
    let url = SqlLedger::create_scratch_database(&admin, "tenet_test")
        .await
        .unwrap();
    let name = url.rsplit_once('/').map_or("", |(_, n)| n);
    let l = SqlLedger::connect(&url).await.unwrap();
    assert_eq!(l.dialect_name(), "postgres");
    suite(&l, async || SqlLedger::connect(&url).await.unwrap()).await;
    l.close().await;
    SqlLedger::admin_execute(&admin, &format!("DROP DATABASE {name}"))
        .await
        .unwrap();
}
