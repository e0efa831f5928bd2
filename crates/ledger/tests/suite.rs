//! One suite, every backend: the same checks run on SQLite (always) and on PostgreSQL (when
//! TENET_TEST_POSTGRES_URL names a server that lets the test create a database; `.ci/run`
//! starts one on 127.0.0.1).

use std::time::Duration;
use tenet_ledger::CoordinatorRecord;
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
    assert_eq!(l.schema_version().await.unwrap(), 5);
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
    l.create_job(&job("j1", 100), &nodes, &[]).await.unwrap();
    conflict(l.create_job(&job("j1", 100), &nodes, &[]).await);
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
    l.create_job(&job("j2", 200), &nodes[..2], &[])
        .await
        .unwrap();
    l.advance_job("j2", JobState::Pending, JobState::Committing, 201)
        .await
        .unwrap();
    l.fail_assignment("j2", "b").await.unwrap();
    conflict(l.fail_assignment("j2", "b").await);
    l.assign("j2", "c").await.unwrap();
    conflict(l.assign("j2", "c").await);
    assert_eq!(l.assignments("j2").await.unwrap().len(), 3);
    l.create_job(&job("j3", 300), &nodes[..1], &[])
        .await
        .unwrap();
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
    l.create_job(&job("j4", 400), &nodes[..2], &[])
        .await
        .unwrap();
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

    // A settlement in which every judged replica agreed (PostgreSQL writes it as one
    // statement): reveals not yet recorded are written with their verdicts, a revealed
    // replica that was not judged is kept as revealed, each agreeing node is credited once;
    // one naming a node the ledger does not know writes nothing at all.
    l.create_job(&job("j5", 450), &nodes, &[]).await.unwrap();
    let commitments = ["a", "b", "c"].map(|n| (n.to_string(), format!("{{\"node\":\"{n}\"}}")));
    l.record_commitments("j5", &commitments, 451).await.unwrap();
    l.record_reveal("j5", "b", "good", "sb").await.unwrap();
    let before: Vec<NodeRecord> = l.nodes().await.unwrap();
    let agreeing = |ids: &[&str]| -> Vec<Verdict> {
        ids.iter()
            .map(|id| Verdict {
                node_id: id.to_string(),
                agreed: true,
                score: 1.0,
                withheld: false,
            })
            .collect()
    };
    let reveals = [
        ("a".to_string(), "good".to_string(), "sa".to_string()),
        ("c".to_string(), "good".to_string(), "sc".to_string()),
    ];
    let with_stranger = agreeing(&["a", "b", "zz"]);
    let five = |verdicts| Settlement {
        output_hash: "good",
        receipt: "{\"r\":5}",
        reveals: &reveals,
        verdicts,
        slash_fraction: 0.1,
        reward: 7,
        at: 452,
    };
    assert!(l.decide_job("j5", &five(&with_stranger)).await.is_err());
    assert_eq!(
        l.job("j5").await.unwrap().unwrap().state,
        JobState::Revealing
    );
    assert_eq!(l.nodes().await.unwrap(), before, "no node was touched");
    assert!(l.job_stake_events("j5").await.unwrap().is_empty());
    let two = agreeing(&["b", "a"]);
    assert!(l.decide_job("j5", &five(&two)).await.unwrap().is_empty());
    let j = l.job("j5").await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.output_hash.as_deref(), j.receipt.as_deref()),
        (JobState::Decided, Some("good"), Some("{\"r\":5}"))
    );
    let asg = l.assignments("j5").await.unwrap();
    let seen: Vec<(&str, AssignmentState, Option<&str>, Option<&str>)> = asg
        .iter()
        .map(|a| {
            (
                a.node_id.as_str(),
                a.state,
                a.output_hash.as_deref(),
                a.salt.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("a", AssignmentState::Agreed, Some("good"), Some("sa")),
            ("b", AssignmentState::Agreed, Some("good"), Some("sb")),
            ("c", AssignmentState::Revealed, Some("good"), Some("sc")),
        ]
    );
    let credits: Vec<(String, i64, String)> = l
        .job_stake_events("j5")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.node_id, e.delta, e.reason))
        .collect();
    assert_eq!(credits.len(), 2);
    for n in ["a", "b"] {
        assert!(
            credits.contains(&(n.to_string(), 7, "credit".to_string())),
            "{credits:?}"
        );
        let was = before.iter().find(|b| b.id == n).unwrap();
        let now = l.node(n).await.unwrap().unwrap();
        assert_eq!(
            (now.stake, now.agreed, now.score_sum),
            (was.stake + 7, was.agreed + 1, was.score_sum + 1.0)
        );
    }
    let c_was = before.iter().find(|b| b.id == "c").unwrap();
    assert_eq!(&l.node("c").await.unwrap().unwrap(), c_was);
    conflict(l.decide_job("j5", &five(&two)).await);

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

    // A job recorded with its key in one write: a second job under the key is not recorded
    // and gets the first back; of two racing, one is recorded and both name it.
    assert_eq!(
        l.create_keyed_job(&job("jk1", 600), &nodes[..1], &[], "k4")
            .await
            .unwrap(),
        None
    );
    assert_eq!(l.assignments("jk1").await.unwrap().len(), 1);
    let small = [("h-keyed".to_string(), vec![1u8, 2, 3])];
    assert_eq!(
        other
            .create_keyed_job(&job("jk2", 601), &nodes[..1], &small, "k4")
            .await
            .unwrap()
            .as_deref(),
        Some("jk1")
    );
    assert!(l.job("jk2").await.unwrap().is_none(), "not recorded");
    assert!(l.assignments("jk2").await.unwrap().is_empty());
    assert!(l.blob("h-keyed").await.unwrap().is_none(), "nor its inputs");
    assert_eq!(
        l.claim_idempotency_key("k4", "jk9", 602).await.unwrap(),
        "jk1"
    );
    let racing = futures_like_join(
        l.create_keyed_job(&job("jk3", 603), &nodes[..1], &[], "k5"),
        other.create_keyed_job(&job("jk4", 603), &nodes[..1], &small, "k5"),
    )
    .await;
    let (ra, rb) = (racing.0.unwrap(), racing.1.unwrap());
    let made: Vec<&str> = [("jk3", &ra), ("jk4", &rb)]
        .iter()
        .filter(|(_, r)| r.is_none())
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        made.len(),
        1,
        "one of two racing submissions records its job"
    );
    for r in [&ra, &rb] {
        assert!(r.as_deref().is_none_or(|held| held == made[0]));
    }
    assert_eq!(
        l.job("jk3").await.unwrap().is_some() as u8 + l.job("jk4").await.unwrap().is_some() as u8,
        1
    );
    for id in ["jk1", "jk3", "jk4"] {
        if l.job(id).await.unwrap().is_some() {
            l.fail_job(id, "a test job", 604).await.unwrap();
        }
    }

    // Everything is still there after reconnecting (a restart), and j2 is still unfinished.
    let again = reopen().await;
    assert_eq!(
        again.schema_version().await.unwrap(),
        5,
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

fn settlement<'a>(verdicts: &'a [Verdict]) -> Settlement<'a> {
    Settlement {
        output_hash: "out",
        receipt: "{}",
        reveals: &[],
        verdicts,
        slash_fraction: 0.1,
        reward: 1,
        at: 9,
    }
}

/// Several coordinators on one ledger: each drives a job only while it holds the job's lease;
/// a stalled one's jobs are claimed by another, and it can no longer write to them — least of
/// all settle them; claims that race split the jobs; tasks, small blobs and the coordinators
/// themselves are shared. `open` connects a new handle to the same database.
async fn leases(open: impl AsyncFn() -> SqlLedger) {
    let ttl = Duration::from_millis(600);
    let plain = open().await;
    let a = open().await.leasing("A", ttl);
    let b = open().await.leasing("B", ttl);
    assert_eq!(a.lease_holder(), Some("A"));
    for id in ["la", "lb"] {
        let mut n = node(id, 100);
        n.state = NodeState::Active;
        plain.register_node(&n).await.unwrap();
    }
    let two = ["la", "lb"].map(String::from).to_vec();
    let input = (b"\x00\x01 small input".to_vec(), "h-small".to_string());
    a.create_job(
        &job("L1", 1000),
        &two,
        &[(input.1.clone(), input.0.clone())],
    )
    .await
    .unwrap();
    // The small blob is the ledger's, readable by every coordinator.
    assert_eq!(b.blob("h-small").await.unwrap(), Some(input.0.clone()));
    assert_eq!(b.blob("h-none").await.unwrap(), None);
    // A's lease is live: B may neither claim the job nor write to it.
    assert!(
        b.claim_jobs(10, false)
            .await
            .unwrap()
            .iter()
            .all(|j| j.id != "L1")
    );
    let agreed = [
        Verdict {
            node_id: "la".into(),
            agreed: true,
            score: 1.0,
            withheld: false,
        },
        Verdict {
            node_id: "lb".into(),
            agreed: true,
            score: 1.0,
            withheld: false,
        },
    ];
    let lost = |r: Result<_, LedgerError>| {
        assert!(
            matches!(r, Err(LedgerError::LeaseLost { .. })),
            "expected the lease to be lost, got {r:?}"
        )
    };
    lost(b.decide_job("L1", &settlement(&agreed)).await.map(|_| ()));
    lost(
        b.advance_job("L1", JobState::Pending, JobState::Committing, 1)
            .await,
    );
    lost(b.record_commitment("L1", "la", "c").await);
    lost(b.assign("L1", "c-none").await);
    a.advance_job("L1", JobState::Pending, JobState::Committing, 1)
        .await
        .unwrap();
    // Renewed, A's lease outlasts its first term.
    for _ in 0..3 {
        tokio::time::sleep(ttl / 3).await;
        assert_eq!(a.renew_leases().await.unwrap(), 1);
    }
    assert!(
        b.claim_jobs(10, false)
            .await
            .unwrap()
            .iter()
            .all(|j| j.id != "L1")
    );
    // A stalls past its lease: B claims the job and A can change nothing of it any more.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    // (Jobs other suites left unfinished in the same database are not this test's.)
    let ours = |jobs: Vec<JobRecord>, prefix: char| -> Vec<JobRecord> {
        jobs.into_iter()
            .filter(|j| j.id.starts_with(prefix))
            .collect()
    };
    let claimed = ours(b.claim_jobs(10, false).await.unwrap(), 'L');
    assert_eq!(
        claimed.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["L1"]
    );
    assert_eq!(
        claimed[0].state,
        JobState::Committing,
        "resumed where A left it"
    );
    assert_eq!(
        a.renew_leases().await.unwrap(),
        0,
        "a lapsed lease is not renewed"
    );
    lost(
        a.record_commitments(
            "L1",
            &[("la".into(), "c".into()), ("lb".into(), "c".into())],
            2,
        )
        .await,
    );
    lost(a.fail_assignment("L1", "la").await);
    lost(a.fail_job("L1", "gave up", 3).await);
    // Both settle at once: only the lease holder's settlement is recorded, once.
    b.record_commitments(
        "L1",
        &[("la".into(), "ca".into()), ("lb".into(), "cb".into())],
        2,
    )
    .await
    .unwrap();
    let (by_a, by_b) = futures_like_join(
        a.decide_job("L1", &settlement(&agreed)),
        b.decide_job("L1", &settlement(&agreed)),
    )
    .await;
    lost(by_a.map(|_| ()));
    by_b.unwrap();
    let credits = plain.job_stake_events("L1").await.unwrap();
    assert_eq!(credits.len(), 2, "each node credited once: {credits:?}");
    for id in ["la", "lb"] {
        let n = plain.node(id).await.unwrap().unwrap();
        assert_eq!((n.agreed, n.disagreed, n.stake), (1, 0, 101), "{n:?}");
    }
    let asg = plain.assignments("L1").await.unwrap();
    assert!(
        asg.iter().all(|a| a.state == AssignmentState::Agreed),
        "{asg:?}"
    );
    assert_eq!(
        plain.job("L1").await.unwrap().unwrap().state,
        JobState::Decided
    );
    conflict(b.decide_job("L1", &settlement(&agreed)).await);

    // Jobs without a lease (a coordinator that died before leasing, or an older ledger), and
    // two coordinators claiming at once: every job goes to exactly one of them.
    for i in 0..24 {
        plain
            .create_job(&job(&format!("M{i:02}"), 2000 + i), &two, &[])
            .await
            .unwrap();
    }
    let (ca, cb) = futures_like_join(a.claim_jobs(16, false), b.claim_jobs(16, false)).await;
    let (ca, cb) = (ours(ca.unwrap(), 'M'), ours(cb.unwrap(), 'M'));
    let rest = ours(a.claim_jobs(100, false).await.unwrap(), 'M');
    let mut all: Vec<String> = ca
        .iter()
        .chain(&cb)
        .chain(&rest)
        .map(|j| j.id.clone())
        .collect();
    all.sort();
    let expected: Vec<String> = (0..24).map(|i| format!("M{i:02}")).collect();
    assert_eq!(
        all,
        expected,
        "claimed once each: A {} B {} then {}",
        ca.len(),
        cb.len(),
        rest.len()
    );
    // A restart under the same holder takes its own live leases back; nobody else can.
    let again = open().await.leasing("A", ttl);
    assert!(ours(b.claim_jobs(100, false).await.unwrap(), 'M').is_empty());
    let own = ours(again.claim_jobs(100, true).await.unwrap(), 'M');
    assert_eq!(own.len(), ca.len() + rest.len());
    for j in &cb {
        plain.fail_job(&j.id, "done with", 5).await.unwrap();
    }

    // The coordinators sharing the ledger, and its tasks.
    for (holder, key) in [("A", "ka"), ("B", "kb")] {
        a.announce_coordinator(&CoordinatorRecord {
            holder: holder.into(),
            key: key.into(),
            url: format!("http://127.0.0.1:9/{holder}"),
            started_at: 5,
            silent_ms: 0,
        })
        .await
        .unwrap();
    }
    let cs = b.coordinators().await.unwrap();
    assert_eq!(
        cs.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(),
        ["ka", "kb"]
    );
    assert!(
        cs.iter().all(|c| (0..60_000).contains(&c.silent_ms)),
        "{cs:?}"
    );
    a.put_task("T1", b"graph bytes", 7).await.unwrap();
    a.put_task("T1", b"graph bytes", 8).await.unwrap();
    assert_eq!(
        b.task("T1").await.unwrap().as_deref(),
        Some(&b"graph bytes"[..])
    );
    assert_eq!(b.task("T2").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_leases() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    leases(async || SqlLedger::connect(&url).await.unwrap()).await;
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
    leases(async || SqlLedger::connect(&url).await.unwrap()).await;
    l.close().await;
    SqlLedger::admin_execute(&admin, &format!("DROP DATABASE {name}"))
        .await
        .unwrap();
}
