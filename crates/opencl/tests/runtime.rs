//! The OpenCL device as a `tenet_exec::Device`: buffers and transfers, copy-on-write writes,
//! gather errors as job errors, graphs refused for memory before anything is allocated,
//! weights uploaded once, kernels built once, stopping, and device discovery.

mod support;

use std::cell::Cell;
use std::collections::HashMap;

use tenet_exec::{Device, ExecError};
use tenet_ir::{
    DType, GraphBuilder, HostTensor, NoWeights, Op, TensorType, WeightSource, WeightsId,
};
use tenet_opencl::{OpenClDevice, Quirks};
use tenet_reference::RunError;

use support::{G, assert_matches, device, hostile_inputs};

#[test]
fn discovery_agrees_with_open() {
    let Some(dev) = device() else {
        return;
    };
    let list = OpenClDevice::list().expect("the library loads");
    assert!(!list.is_empty());
    assert_eq!(list[0].0, 0);
    let info = dev.info();
    assert_eq!(info.spec, "opencl:0");
    assert_eq!(info.name, list[0].1);
    assert!(info.memory > 0);
    assert!(info.exact.passed(), "{:?}", info.exact);
    let e = OpenClDevice::open(list.len(), Quirks::default()).unwrap_err();
    assert!(e.to_string().contains("no OpenCL device"), "{e}");
}

#[test]
fn specs_name_devices() {
    assert_eq!(OpenClDevice::parse_spec("opencl"), Some(0));
    assert_eq!(OpenClDevice::parse_spec("opencl:3"), Some(3));
    for bad in [
        "cpu",
        "opencl:",
        "opencl3",
        "opencl:x",
        "opencl:-1",
        "openclx:1",
    ] {
        assert_eq!(OpenClDevice::parse_spec(bad), None, "{bad}");
    }
}

#[test]
fn programs_run_from_many_threads_at_once() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<OpenClDevice>();
    let Some(dev) = device() else {
        return;
    };
    let g = GraphBuilder::new();
    let a = g.input("a", DType::F32, &[9, 40]);
    let b = g.input("b", DType::F32, &[40, 7]);
    let c = a.matmul(&b).softmax(-1).sum(&[0], false);
    let graph = g.finish(&[("c", &c)]).unwrap();
    let program = dev.compile(&graph).unwrap();
    type Run = (HashMap<String, HostTensor>, Vec<(String, HostTensor)>);
    let runs: Vec<Run> = (0..4)
        .map(|s| {
            let inputs = hostile_inputs(&graph, s);
            let want = tenet_reference::run(&graph, &inputs, &NoWeights, 0).unwrap();
            (inputs, want)
        })
        .collect();
    std::thread::scope(|scope| {
        for (inputs, want) in &runs {
            let program = &program;
            scope.spawn(move || {
                for _ in 0..5 {
                    assert_eq!(&program.run(inputs, &NoWeights, 0).unwrap(), want);
                }
            });
        }
    });
}

#[test]
fn uploads_downloads_and_zeros() {
    let Some(dev) = device() else {
        return;
    };
    for ty in [
        TensorType::new(DType::F32, [3, 5]),
        TensorType::new(DType::U8, [7]),
        TensorType::new(DType::I64, [0, 4]),
        TensorType::new(DType::Bool, []),
    ] {
        let t = support::hostile(&mut tenet_ir::testing::Rng(1), &ty);
        let b = dev.upload(&t).unwrap();
        assert_eq!(b.ty(), &ty);
        assert_eq!(dev.download(&b).unwrap(), t);
        let z = dev.zeros(&ty).unwrap();
        assert_eq!(
            dev.download(&z).unwrap(),
            HostTensor::zeros(ty.clone()).unwrap()
        );
    }
}

#[test]
fn writes_copy_shared_buffers_first() {
    let Some(dev) = device() else {
        return;
    };
    let a = HostTensor::from_i32(&[6], &[1, 2, 3, 4, 5, 6]).unwrap();
    let src = dev
        .upload(&HostTensor::from_i32(&[2], &[-7, -8]).unwrap())
        .unwrap();
    let original = dev.upload(&a).unwrap();
    let mut shared = original.clone();
    dev.write(&mut shared, 8, &src).unwrap();
    assert_eq!(
        dev.download(&shared).unwrap().to_i64_vec(),
        [1, 2, -7, -8, 5, 6]
    );
    assert_eq!(
        dev.download(&original).unwrap(),
        a,
        "the clone was copied first"
    );
    // A buffer of its own is written in place; one that does not fit is refused.
    let mut own = dev.upload(&a).unwrap();
    dev.write(&mut own, 16, &src).unwrap();
    assert_eq!(
        dev.download(&own).unwrap().to_i64_vec(),
        [1, 2, 3, 4, -7, -8]
    );
    assert!(dev.write(&mut own, 20, &src).is_err());
    // A reshape shares the memory too.
    let mut reshaped = original
        .retyped(TensorType::new(DType::I32, [2, 3]))
        .unwrap();
    dev.write(&mut reshaped, 0, &src).unwrap();
    assert_eq!(dev.download(&original).unwrap(), a);
}

#[test]
fn buffers_of_another_device_are_refused() {
    let Some(dev) = device() else {
        return;
    };
    let other = OpenClDevice::open(0, Quirks::default()).unwrap();
    let b = other
        .upload(&HostTensor::from_f32(&[2], &[1.0, 2.0]).unwrap())
        .unwrap();
    assert!(matches!(dev.download(&b), Err(ExecError::Device(_))));
}

#[test]
fn out_of_range_gather_is_a_job_error() {
    let Some(dev) = device() else {
        return;
    };
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4, 3]);
    let i = g.input("i", DType::I64, &[2, 3]);
    let y = x.gather(&i, 0).exp();
    let graph = g.finish(&[("y", &y)]).unwrap();
    for idx in [
        [0i64, 1, 9, 2, -5, 3],
        [0, -4, 3, 2, 1, -1],
        [i64::MIN, 0, 0, 0, 0, i64::MAX],
        [4, 4, 4, 4, 4, 4],
    ] {
        let mut inputs = hostile_inputs(&graph, 1);
        inputs.insert("i".into(), HostTensor::from_i64(&[2, 3], &idx).unwrap());
        assert_matches(dev, &graph, &inputs, &NoWeights, 0, "gather");
    }
    let mut inputs = hostile_inputs(&graph, 1);
    inputs.insert(
        "i".into(),
        HostTensor::from_i64(&[2, 3], &[0, 1, 9, 2, -5, 3]).unwrap(),
    );
    let e = dev
        .compile(&graph)
        .unwrap()
        .run(&inputs, &NoWeights, 0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            ExecError::Run(RunError::IndexOutOfRange {
                index: 9,
                size: 4,
                ..
            })
        ),
        "{e}"
    );
}

#[test]
fn the_first_error_in_graph_order_wins() {
    let Some(dev) = device() else {
        return;
    };
    // A failing gather before a missing weight, and after it.
    for gather_first in [true, false] {
        let g = GraphBuilder::new();
        let x = g.input("x", DType::F32, &[4]);
        let i = g.input("i", DType::I32, &[2]);
        let file = WeightsId([7; 32]);
        let (y, w) = if gather_first {
            let y = x.gather(&i, 0);
            (y, g.weight(file, "w", DType::F32, &[2]))
        } else {
            let w = g.weight(file, "w", DType::F32, &[2]);
            (x.gather(&i, 0), w)
        };
        let graph = g.finish(&[("z", &(&y + &w))]).unwrap();
        let mut inputs = hostile_inputs(&graph, 1);
        inputs.insert("i".into(), HostTensor::from_i32(&[2], &[1, 4]).unwrap());
        assert_matches(dev, &graph, &inputs, &NoWeights, 0, "gather vs weight");
    }
    // Input errors, as the reference words them.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4]);
    let graph = g.finish(&[("y", &x.exp())]).unwrap();
    assert_matches(dev, &graph, &HashMap::new(), &NoWeights, 0, "missing input");
    let wrong = HashMap::from([(
        "x".to_string(),
        HostTensor::from_f32(&[3], &[1.0; 3]).unwrap(),
    )]);
    assert_matches(dev, &graph, &wrong, &NoWeights, 0, "wrong input type");
}

#[test]
fn graphs_above_the_memory_limit_are_refused_at_compile() {
    if device().is_none() {
        return;
    }
    let small = OpenClDevice::open_with_memory_limit(0, Quirks::default(), Some(4 << 20)).unwrap();
    assert_eq!(small.info().memory, 4 << 20);
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1 << 20]);
    let graph = g.finish(&[("y", &x.exp())]).unwrap();
    let needed = graph.cost().peak_bytes;
    assert_eq!(needed, 8 << 20);
    match small.compile(&graph) {
        Err(ExecError::TooLarge { needed: n, limit }) => {
            assert!(n >= needed);
            assert_eq!(limit, 4 << 20);
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a graph above the limit compiled"),
    }
    assert_eq!(
        small.program_builds(),
        0,
        "refused before building anything"
    );
    // What fits compiles, and its bound is the certificate plus documented scratch.
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[1 << 10]);
    let graph = g.finish(&[("y", &x.exp())]).unwrap();
    let p = small.compile(&graph).unwrap();
    assert_eq!(
        p.memory_bound(),
        graph.cost().peak_bytes + tenet_opencl::RUN_FIXED
    );
}

/// Weights by (file, tensor), counting how often a run asks for one.
struct Counting {
    inner: HashMap<(WeightsId, String), HostTensor>,
    asked: Cell<usize>,
}

impl WeightSource for Counting {
    fn weight(&self, file: &WeightsId, tensor: &str) -> Option<&HostTensor> {
        self.asked.set(self.asked.get() + 1);
        self.inner.weight(file, tensor)
    }
}

#[test]
fn weights_are_uploaded_once() {
    if device().is_none() {
        return;
    }
    // A device of its own, so the cache starts empty.
    let dev = OpenClDevice::open(0, Quirks::default()).unwrap();
    let file = WeightsId([3; 32]);
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[2, 3]);
    let w = g.weight(file, "w", DType::F32, &[3, 4]);
    let graph = g.finish(&[("y", &x.matmul(&w))]).unwrap();
    let (inputs, _) = tenet_ir::testing::random_io(&graph, 1);
    let weights = Counting {
        inner: HashMap::from([(
            (file, "w".to_string()),
            HostTensor::from_f32(&[3, 4], &[0.5; 12]).unwrap(),
        )]),
        asked: Cell::new(0),
    };
    let program = dev.compile(&graph).unwrap();
    let first = program.run(&inputs, &weights, 0).unwrap();
    assert_eq!(weights.asked.get(), 1);
    assert_eq!(dev.cached_weights(), (1, 48));
    let second = program.run(&inputs, &weights, 0).unwrap();
    assert_eq!(weights.asked.get(), 1, "the second run uploaded nothing");
    assert_eq!(dev.cached_weights(), (1, 48));
    assert_eq!(first, second);
    // Another graph over the same weights finds them cached too.
    let g = GraphBuilder::new();
    let w = g.weight(file, "w", DType::F32, &[3, 4]);
    let graph = g.finish(&[("s", &w.sum(&[0], false))]).unwrap();
    dev.compile(&graph)
        .unwrap()
        .run(&HashMap::new(), &weights, 0)
        .unwrap();
    assert_eq!(weights.asked.get(), 1);
    // A weight of the wrong type is the reference's error.
    let g = GraphBuilder::new();
    let w = g.weight(WeightsId([4; 32]), "w", DType::F32, &[2]);
    let graph = g.finish(&[("y", &w.exp())]).unwrap();
    let wrong = HashMap::from([(
        (WeightsId([4; 32]), "w".to_string()),
        HostTensor::from_f32(&[3], &[1.0; 3]).unwrap(),
    )]);
    assert_matches(&dev, &graph, &HashMap::new(), &wrong, 0, "weight type");
    assert_eq!(dev.cached_weights(), (1, 48), "nothing cached for it");
    assert_matches(
        &dev,
        &graph,
        &HashMap::new(),
        &NoWeights,
        0,
        "missing weight",
    );
}

#[test]
fn kernels_are_built_once_per_device() {
    if device().is_none() {
        return;
    }
    let dev = OpenClDevice::open(0, Quirks::default()).unwrap();
    let graph = |n: u64| {
        let g = GraphBuilder::new();
        let a = g.input("a", DType::F32, &[n, 8]);
        let b = g.input("b", DType::F32, &[8, n]);
        let c = a.matmul(&b).softmax(-1) + 1.0;
        g.finish(&[("c", &c)]).unwrap()
    };
    dev.compile(&graph(3)).unwrap();
    let built = dev.program_builds();
    assert!((1..=3).contains(&built), "{built}");
    dev.compile(&graph(5)).unwrap();
    assert_eq!(
        dev.program_builds(),
        built,
        "the same op kinds build nothing new"
    );
}

#[test]
fn outputs_stay_on_the_device_and_runs_can_stop() {
    let Some(dev) = device() else {
        return;
    };
    let g = GraphBuilder::new();
    let x = g.input("x", DType::F32, &[4]);
    let y = (&x * 2.0).exp();
    let z = x.reshape(&[2, 2]);
    let graph = g.finish(&[("y", &y), ("z", &z), ("x", &x)]).unwrap();
    let p = dev.compile(&graph).unwrap();
    let t = HostTensor::from_f32(&[4], &[1.0, -2.0, 0.5, 3.0]).unwrap();
    let inputs = HashMap::from([("x".to_string(), dev.upload(&t).unwrap())]);
    let (outs, stats) = p.run_buffers(&inputs, &NoWeights, 0, &|| false).unwrap();
    assert_eq!(outs.len(), 3);
    assert_eq!(dev.download(&outs[2].1).unwrap(), t);
    assert_eq!(outs[1].1.ty(), &TensorType::new(DType::F32, [2, 2]));
    assert!(stats.peak_bytes <= graph.cost().peak_bytes);
    assert!(stats.polls >= 1);
    let stopped = p.run_buffers(&inputs, &NoWeights, 0, &|| true);
    assert!(matches!(stopped, Err(ExecError::Stopped)));
}

#[test]
fn large_tensors_walk_the_whole_index_space() {
    let Some(dev) = device() else {
        return;
    };
    // More elements than one launch has work items (grid-stride loops).
    let mut g = G::default();
    let x = g.input("x", DType::F16, &[3, 700_001]);
    let y = g.input("y", DType::F16, &[700_001]);
    let s = g
        .push(
            Op::Binary {
                op: tenet_ir::BinaryOp::Mul,
                a: x,
                b: y,
            },
            None,
        )
        .unwrap();
    let graph = g.finish(&[s]);
    let inputs = hostile_inputs(&graph, 2);
    assert_matches(dev, &graph, &inputs, &NoWeights, 0, "large mul");
}

/// Run this test binary's `test` in a child process with `env`, optionally under `wrap`
/// (a command line the binary's path and arguments are appended to).
fn child(test: &str, env: &[(&str, &std::ffi::OsStr)], wrap: &[&str]) -> bool {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = std::process::Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
        None => std::process::Command::new(&exe),
    };
    // OCL_ICD_FILENAMES names vendor libraries directly, past any OCL_ICD_VENDORS a test
    // sets (how a machine whose GPU library is outside the vendors folder is pointed at it).
    cmd.args([test, "--exact", "--nocapture"])
        .env("TENET_OPENCL_CHILD", "1")
        .env_remove("OCL_ICD_FILENAMES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.status().is_ok_and(|s| s.success())
}

#[test]
fn no_device_means_unavailable_without_panics() {
    // In a child process without any OpenCL device (or library): nothing is listed, nothing
    // opens, nothing panics.
    if std::env::var("TENET_OPENCL_CHILD").is_ok() {
        assert!(!OpenClDevice::available());
        // No platform: an empty list; no library at all: an error saying so.
        assert!(OpenClDevice::list().map_or(true, |l| l.is_empty()));
        assert!(OpenClDevice::open(0, Quirks::default()).is_err());
        return;
    }
    if device().is_none() {
        return;
    }
    const TEST: &str = "no_device_means_unavailable_without_panics";
    // An ICD loader that finds no vendor.
    let dir = std::env::temp_dir().join(format!("tenet-no-icd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ok = child(TEST, &[("OCL_ICD_VENDORS", dir.as_os_str())], &[]);
    let _ = std::fs::remove_dir(&dir);
    assert!(ok, "no platform");
    // No libOpenCL.so.1 at all, where a private mount namespace can hide it (root only).
    let lib = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libOpenCL.so.1");
    let can_hide = lib.exists()
        && std::process::Command::new("unshare")
            .args(["-m", "true"])
            .status()
            .is_ok_and(|s| s.success());
    if can_hide {
        let real = std::fs::canonicalize(lib).unwrap();
        let script = format!("mount --bind /dev/null {} && exec \"$@\"", real.display());
        assert!(
            child(TEST, &[], &["unshare", "-m", "sh", "-c", &script, "sh"]),
            "no library"
        );
    }
}

/// A device whose build breaks the exact tier's rules — contraction allowed, or denormals
/// flushed — fails its determinism check when it opens, says why, and offers the tolerant
/// tier only (what a node advertises, and so what the coordinator sends it).
#[test]
fn a_broken_device_is_refused_for_the_exact_tier() {
    if device().is_none() {
        return;
    }
    assert!(device().unwrap().info().exact.passed());
    for (quirks, named) in [
        (
            Quirks {
                contract: true,
                flush_denormals: false,
            },
            "contract",
        ),
        (
            Quirks {
                contract: false,
                flush_denormals: true,
            },
            "denormal",
        ),
    ] {
        let info = {
            // Discovery is serialised inside `open`; this device is a second one on the same
            // hardware, built with the defect.
            OpenClDevice::open(0, quirks).expect("the broken device still opens")
        }
        .info();
        match &info.exact {
            tenet_exec::ExactCheck::Failed(why) => {
                assert!(why.contains(named), "{quirks:?}: {why}")
            }
            tenet_exec::ExactCheck::Passed => panic!("{quirks:?} passed the check"),
        }
        assert_eq!(info.tiers(), ["tolerant"], "{quirks:?}");
    }
}
