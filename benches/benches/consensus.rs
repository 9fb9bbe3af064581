//! `Consensus::propose` at micro level: a burst of proposals queued at once (so they share
//! entries) and awaited, on a single node, raft vs solo, kv vs noop state machine, memory
//! backend. `concord-bench consensus` measures the same layer with closed-loop proposers.

use std::sync::Arc;
use std::time::Duration;

use concord_consensus::{
    Consensus, InProcessNetwork, KvCommand, KvStateMachine, NodeConfig, NoopStateMachine, RaftNode,
    SoloNode, StateMachine, StateMachineFactory,
};
use concord_storage::{BackendKind, GroupId, StoreConfig, Stores};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn start(raft: bool, factory: Arc<dyn StateMachineFactory>) -> Arc<dyn Consensus> {
    let stores = Stores::open(&StoreConfig::new(BackendKind::Memory, "unused")).unwrap();
    let config = NodeConfig::new(1, vec![1], vec![0]);
    let node: Arc<dyn Consensus> = if raft {
        let network = InProcessNetwork::new();
        let node = RaftNode::start(config, stores, factory, network.transport(1)).unwrap();
        network.register(1, node.sink());
        node
    } else {
        SoloNode::start(config, stores, factory).unwrap()
    };
    while !node.status(0).unwrap().is_leader {
        std::thread::sleep(Duration::from_millis(5));
    }
    node
}

fn propose_burst(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut bench = c.benchmark_group("Consensus::propose");
    bench
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let command = KvCommand::Put {
        key: b"session/0001".to_vec(),
        value: vec![0x42; 150],
    }
    .encode();
    for (machine, factory) in [
        (
            "kv",
            Arc::new(|_g: GroupId| Box::new(KvStateMachine) as Box<dyn StateMachine>)
                as Arc<dyn StateMachineFactory>,
        ),
        (
            "noop",
            Arc::new(|_g: GroupId| Box::new(NoopStateMachine) as Box<dyn StateMachine>)
                as Arc<dyn StateMachineFactory>,
        ),
    ] {
        for raft in [true, false] {
            let node = start(raft, factory.clone());
            for burst in [1usize, 64, 1024] {
                bench.throughput(Throughput::Elements(burst as u64));
                let name = format!("{}/{machine}", if raft { "raft" } else { "solo" });
                bench.bench_function(BenchmarkId::new(name, format!("burst={burst}")), |b| {
                    b.iter(|| {
                        runtime.block_on(async {
                            let pending: Vec<_> = (0..burst)
                                .map(|_| node.propose(0, command.clone()))
                                .collect();
                            for answer in pending {
                                answer.await.unwrap();
                            }
                        })
                    })
                });
            }
            node.shutdown();
        }
    }
    bench.finish();
}

criterion_group!(benches, propose_burst);
criterion_main!(benches);
