//! The launcher: torchrun's variables, rank-prefixed output, and the first failure ending the
//! others, using `sh` children so no GPU is needed.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prepare::launch::{launch, LaunchError, LaunchSpec, OutputSink, RankEnvironment, Stream};

#[derive(Default)]
struct Collect(Mutex<Vec<(u32, Stream, String)>>);

impl OutputSink for Collect {
    fn line(&self, rank: u32, stream: Stream, line: &str) {
        self.0.lock().unwrap().push((rank, stream, line.to_owned()));
    }
}

fn shell(script: &str, ranks: u32) -> LaunchSpec {
    LaunchSpec {
        program: PathBuf::from("sh"),
        args: vec![OsString::from("-c"), OsString::from(script)],
        gpus: (0..ranks).collect(),
        master_addr: "127.0.0.1".to_owned(),
        master_port: 29500,
        env: vec![(OsString::from("EXTRA"), OsString::from("yes"))],
        deadline: Some(Duration::from_secs(60)),
    }
}

#[test]
fn children_see_torchrun_variables_and_output_is_tagged_by_rank() {
    let sink = Arc::new(Collect::default());
    let script = "echo \"$RANK/$WORLD_SIZE local=$LOCAL_RANK $MASTER_ADDR:$MASTER_PORT gpus=$PREPARE_GPUS extra=$EXTRA\"; echo oops >&2";
    launch(&shell(script, 3), &(sink.clone() as Arc<dyn OutputSink>)).unwrap();
    let mut lines = sink.0.lock().unwrap().clone();
    lines.sort_by(|a, b| (a.0, a.1 as u8, &a.2).cmp(&(b.0, b.1 as u8, &b.2)));
    let expected: Vec<(u32, Stream, String)> = (0..3)
        .flat_map(|rank| {
            [
                (
                    rank,
                    Stream::Stdout,
                    format!("{rank}/3 local={rank} 127.0.0.1:29500 gpus=0,1,2 extra=yes"),
                ),
                (rank, Stream::Stderr, "oops".to_owned()),
            ]
        })
        .collect();
    assert_eq!(lines, expected);
}

#[test]
fn first_failure_ends_the_others_and_names_the_rank() {
    let sink = Arc::new(Collect::default());
    // Rank 1 fails quickly; ranks 0 and 2 would run for a minute.
    let script = "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 7; fi; sleep 60";
    let started = Instant::now();
    let error = launch(&shell(script, 3), &(sink as Arc<dyn OutputSink>)).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the others were not ended"
    );
    match &error {
        LaunchError::RankFailed { rank, code, .. } => {
            assert_eq!((*rank, *code), (1, Some(7)));
        }
        other => panic!("unexpected error {other:?}"),
    }
    // Not one of the tool's codes (a rank that panicked exits with 101): a runtime failure.
    assert_eq!(error.exit_code(), 3);
    assert_eq!(
        error.to_string(),
        "rank 1 failed: exited with code 7; the other ranks were stopped"
    );
}

#[test]
fn a_killed_rank_is_reported_with_its_signal() {
    let sink = Arc::new(Collect::default());
    let script = "if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 60";
    let error = launch(&shell(script, 2), &(sink as Arc<dyn OutputSink>)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "rank 0 failed: was killed by signal 9; the other ranks were stopped"
    );
    assert_eq!(error.exit_code(), 3);
}

#[test]
fn deadline_stops_every_child() {
    let sink = Arc::new(Collect::default());
    let mut spec = shell("sleep 60", 2);
    spec.deadline = Some(Duration::from_millis(300));
    let started = Instant::now();
    let error = launch(&spec, &(sink as Arc<dyn OutputSink>)).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(matches!(error, LaunchError::Deadline { ref running, .. } if running == &[0, 1]));
}

#[test]
fn a_program_that_cannot_start_names_the_rank() {
    let sink = Arc::new(Collect::default());
    let mut spec = shell("true", 2);
    spec.program = PathBuf::from("/nonexistent/prepare");
    let error = launch(&spec, &(sink as Arc<dyn OutputSink>)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "could not start rank 0 (/nonexistent/prepare)"
    );
    let source = std::error::Error::source(&error).expect("the OS error is kept");
    assert!(source.to_string().contains("No such file"), "{source}");
}

#[test]
fn rank_environment_parses_and_names_bad_variables() {
    let vars = |pairs: &[(&str, &str)]| {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        move |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        }
    };
    let good = RankEnvironment::from_lookup(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap();
    assert_eq!(
        good,
        RankEnvironment {
            rank: 1,
            world_size: 2,
            local_rank: 1,
            master_addr: "10.0.0.1".to_owned(),
            master_port: 29500
        }
    );
    let missing =
        RankEnvironment::from_lookup(vars(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap_err();
    assert_eq!(
        missing.to_string(),
        "MASTER_ADDR is not set (a rank needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
    );
    let out_of_range = RankEnvironment::from_lookup(vars(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "1"),
    ]))
    .unwrap_err();
    assert_eq!(
        out_of_range.to_string(),
        "RANK=\"2\" is not valid: an integer from 0 to 1"
    );
}

#[test]
fn the_picked_port_has_its_rendezvous_neighbour_free() {
    let port = prepare::launch::free_port_pair().unwrap();
    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::net::TcpListener::bind(("127.0.0.1", port + 1)).unwrap();
}
