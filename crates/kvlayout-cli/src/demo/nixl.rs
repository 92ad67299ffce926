//! `kvlayout demo --engine nixl`: the decode side as a second process, over NIXL on
//! loopback.
//!
//! The demo's process is the prefill side: it registers each prefill rank's cache with a
//! NIXL agent, listens on an ephemeral port of 127.0.0.1 and starts itself again as the
//! decode side (the hidden subcommand `demo-peer`, with the same scenario flags and the
//! port). Over that socket it sends one `Hello` per prefill rank (handshake and agent
//! metadata, as the connector frames them); the decode process decodes them, pulls on each
//! decode rank with a NIXL engine of its own (`rank::run`), and sends back each rank's figures
//! (JSON), cache bytes and decode outputs, which the prefill process verifies against its
//! caches. Frames are a u64 length then the bytes, every length bounded, every wait bounded;
//! the child is killed and reaped on any failure.
//!
//! Where the NIXL library does not load, `--engine nixl` is a user error (exit 2, one line
//! with the loader's reason and how to put the library on `LD_LIBRARY_PATH`): the user asked
//! for an engine this machine cannot run, as `--backend cuda` without a GPU.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvlayout_connector::engine::TransferEngine;
use kvlayout_connector::handshake::{Limits, PeerMetadata};
use kvlayout_connector::nixl::{Hello, NixlEngine};

use super::rank::{self, Published, RankRun};
use super::scenario::Scenario;
use super::DemoArgs;
use crate::CliError;

/// Bound on every socket read and write, and on the child's start and end.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// The decode process exits after this long whatever happens.
const CHILD_LIFETIME: Duration = Duration::from_secs(300);

/// Largest frame accepted (a rank's cache is at most 1 GiB, see the scenario; each frame is
/// checked against the length the scenario expects right after it is received).
const MAX_FRAME: u64 = 1 << 31;

/// The hidden subcommand's arguments (the decode side's process).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PeerArgs {
    /// The scenario, as the demo was given it.
    #[command(flatten)]
    pub demo: DemoArgs,
    /// Address of the prefill side's socket (127.0.0.1:PORT).
    #[arg(long, value_name = "ADDR")]
    pub connect: String,
}

/// Whether NIXL loads here; a one-line user error saying why not.
pub(crate) fn available() -> Result<(), CliError> {
    kvlayout_connector::nixl::available()
        .map_err(|why| CliError::Usage(format!("--engine nixl: {why}")))
}

fn io(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::Failed(format!("--engine nixl: {what}: {e}"))
}

fn send(s: &mut TcpStream, bytes: &[u8]) -> Result<(), CliError> {
    s.write_all(&(bytes.len() as u64).to_le_bytes())
        .and_then(|()| s.write_all(bytes))
        .and_then(|()| s.flush())
        .map_err(|e| io("sending to the other process", e))
}

fn recv(s: &mut TcpStream) -> Result<Vec<u8>, CliError> {
    let mut len = [0u8; 8];
    s.read_exact(&mut len)
        .map_err(|e| io("receiving from the other process", e))?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io(
            "receiving",
            format!("a frame of {len} bytes, over {MAX_FRAME}"),
        ));
    }
    let mut v = vec![0u8; len as usize];
    s.read_exact(&mut v)
        .map_err(|e| io("receiving from the other process", e))?;
    Ok(v)
}

fn timeouts(s: &TcpStream) -> Result<(), CliError> {
    s.set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| io("socket", e))
}

/// The decode process, killed and reaped when dropped before it exits.
struct Peer {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Peer {
    /// Starts this binary as `demo-peer` with the scenario's flags.
    fn spawn(a: &DemoArgs, addr: &str) -> Result<Peer, CliError> {
        let exe = std::env::current_exe().map_err(|e| io("finding this binary", e))?;
        let mut cmd = Command::new(exe);
        cmd.arg("demo-peer").args(["--connect", addr]);
        for (flag, value) in [
            ("--preset", &a.preset),
            ("--prefill", &a.prefill),
            ("--decode", &a.decode),
            ("--prefill-tp", &a.prefill_tp),
            ("--tp", &a.tp),
            ("--layers", &a.layers),
            ("--blocks", &a.blocks),
            ("--prompts", &a.prompts),
            ("--plan", &a.plan),
            ("--backend", &a.backend),
            ("--engine", &a.engine),
            ("--seed", &a.seed),
        ] {
            cmd.arg(format!("{flag}={value}"));
        }
        if std::env::var_os("UCX_NET_DEVICES").is_none() {
            cmd.env("UCX_NET_DEVICES", "lo");
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io("starting the decode process", e))?;
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(err) = child.stderr.take() {
            let sink = Arc::clone(&stderr);
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                    s.push_str(&line);
                    s.push(' ');
                }
            });
        }
        Ok(Peer { child, stderr })
    }

    /// What the child printed on stderr so far.
    fn said(&self) -> String {
        let s = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        s.trim().to_string()
    }

    /// Accepts the child's connection, or says why not (it exited, or the timeout).
    fn accept(&mut self, listener: &TcpListener) -> Result<TcpStream, CliError> {
        listener
            .set_nonblocking(true)
            .map_err(|e| io("socket", e))?;
        let start = Instant::now();
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(|e| io("socket", e))?;
                    timeouts(&s)?;
                    return Ok(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(io("accepting the decode process", e)),
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.failed(&format!("the decode process exited ({status})")));
            }
            if start.elapsed() > IO_TIMEOUT {
                return Err(io(
                    "the decode process did not connect",
                    format!("{IO_TIMEOUT:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `e` with what the child said.
    fn failed(&self, e: &str) -> CliError {
        // Give the stderr reader a moment to catch the child's last line.
        std::thread::sleep(Duration::from_millis(50));
        CliError::Failed(format!(
            "--engine nixl: {e}; decode process: {}",
            self.said()
        ))
    }

    /// Waits (bounded) for the child to exit successfully.
    fn finish(&mut self) -> Result<(), CliError> {
        let start = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) if s.success() => return Ok(()),
                Ok(Some(s)) => return Err(self.failed(&format!("exited with {s}"))),
                Ok(None) if start.elapsed() > IO_TIMEOUT => {
                    return Err(self.failed("did not exit in time"))
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(io("waiting for the decode process", e)),
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn engine_error(e: impl std::fmt::Display) -> CliError {
    CliError::Failed(format!("--engine nixl: {e}"))
}

/// The prefill side: publishes each rank over the socket, lets the decode process pull,
/// and receives its ranks' figures, caches and outputs.
pub(crate) fn run(
    a: &DemoArgs,
    sc: &Scenario,
    prefill: Vec<Vec<Vec<u8>>>,
) -> Result<super::Pulled, CliError> {
    let tag = std::process::id();
    let mut engines = Vec::new();
    let mut hellos = Vec::new();
    let mut published = Vec::new();
    let mut encode_s = 0.0;
    for (r, bytes) in prefill.into_iter().enumerate() {
        let e = NixlEngine::new(&format!("demo-{tag}-prefill-{r}"), bytes).map_err(engine_error)?;
        let peer = PeerMetadata {
            engine_id: e.name().to_string(),
            groups: vec![rank::group(&sc.prefill, r as u64, e.regions())],
        };
        let t = Instant::now();
        peer.validate(&Limits::default())
            .map_err(|e| CliError::Usage(format!("prefill rank {r}: handshake: {e}")))?;
        let handshake = peer.encode();
        encode_s += t.elapsed().as_secs_f64();
        let agent_metadata = e.local_metadata().map_err(engine_error)?;
        hellos.push(
            Hello {
                peer,
                agent_metadata: agent_metadata.clone(),
            }
            .encode(),
        );
        published.push(Published {
            handshake,
            engine: agent_metadata,
        });
        engines.push(e);
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| io("listening", e))?;
    let addr = listener.local_addr().map_err(|e| io("listening", e))?;
    let mut peer = Peer::spawn(a, &addr.to_string())?;
    let mut s = peer.accept(&listener)?;
    let exchange = |s: &mut TcpStream| -> Result<Vec<RankRun>, CliError> {
        send(s, &(hellos.len() as u64).to_le_bytes())?;
        for h in &hellos {
            send(s, h)?;
        }
        (0..sc.decode.tp)
            .map(|expected| receive_rank(s, sc, expected))
            .collect()
    };
    let ranks = match exchange(&mut s) {
        Ok(r) => r,
        Err(e) => return Err(peer.failed(&e.to_string())),
    };
    peer.finish()?;
    // Each engine's cache back, one rank at a time (a copy, then the engine is dropped).
    let prefill = engines
        .into_iter()
        .map(|e| e.buffers().map_err(engine_error))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(super::Pulled {
        published,
        encode_s,
        ranks,
        prefill,
    })
}

/// A reply of the decode process that does not fit the scenario.
fn bad_reply(what: String) -> CliError {
    io("the decode process's reply", what)
}

/// Decode rank `expected`'s figures, cache and outputs ([`send_rank`]), each checked as it
/// comes: the rank, the hash's length, each buffer's (its extent) and each output's.
fn receive_rank(s: &mut TcpStream, sc: &Scenario, expected: u64) -> Result<RankRun, CliError> {
    let json = recv(s)?;
    let mut run: RankRun =
        serde_json::from_slice(&json).map_err(|e| io("reading a decode rank's figures", e))?;
    if run.rank != expected {
        return Err(bad_reply(format!(
            "rank {} where rank {expected} of TP {} was due",
            run.rank, sc.decode.tp
        )));
    }
    if run.compat_hash.len() < 16 || !run.compat_hash.is_ascii() {
        return Err(bad_reply(format!(
            "rank {expected}: compatibility hash {:?} is not a hash",
            run.compat_hash
        )));
    }
    for (i, x) in sc.decode.layout.extents().iter().enumerate() {
        let buffer = recv(s)?;
        if buffer.len() as u64 != x.end {
            return Err(bad_reply(format!(
                "rank {expected}: buffer {i} of {} bytes, the layout's is {}",
                buffer.len(),
                x.end
            )));
        }
        run.cache.push(buffer);
    }
    let q = sc.q_range(sc.decode.tp, expected);
    let out_len = sc.prompts.len() as u64 * (q.end - q.start) * sc.value_width * 4;
    for layer in 0..sc.layers {
        let bytes = recv(s)?;
        if bytes.len() as u64 != out_len {
            return Err(bad_reply(format!(
                "rank {expected}: layer {layer}'s output of {} bytes, expected {out_len}",
                bytes.len()
            )));
        }
        run.outputs.push(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
        );
    }
    Ok(run)
}

fn send_rank(s: &mut TcpStream, run: &RankRun) -> Result<(), CliError> {
    let json = serde_json::to_vec(run).map_err(|e| io("writing a rank's figures", e))?;
    send(s, &json)?;
    for b in &run.cache {
        send(s, b)?;
    }
    for out in &run.outputs {
        let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        send(s, &bytes)?;
    }
    Ok(())
}

/// `kvlayout demo-peer`: the decode process. Prints nothing on success.
pub(crate) fn peer(a: &PeerArgs) -> Result<String, CliError> {
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        let _ = writeln!(
            std::io::stderr(),
            "error: demo-peer: exiting after {CHILD_LIFETIME:?}"
        );
        std::process::exit(1);
    });
    let sc = Scenario::from_args(&a.demo)?;
    let be = crate::common::backend::open(&a.demo.backend, None)?;
    let mut s = TcpStream::connect(&a.connect).map_err(|e| io("connecting", e))?;
    timeouts(&s)?;
    let count = recv(&mut s)?;
    let count = u64::from_le_bytes(count.try_into().unwrap_or([0xff; 8]));
    if count != sc.prefill.tp {
        return Err(io(
            "handshake",
            format!("{count} prefill ranks, expected {}", sc.prefill.tp),
        ));
    }
    let mut published = Vec::new();
    for _ in 0..count {
        let hello = Hello::decode(&recv(&mut s)?, &Limits::default())
            .map_err(|e| CliError::Usage(format!("handshake refused: {e}")))?;
        published.push(Published {
            handshake: hello.peer.encode(),
            engine: hello.agent_metadata,
        });
    }
    let tag = std::process::id();
    for r in 0..sc.decode.tp {
        let run = rank::run(&be, &sc, r, &published, |buffers| {
            NixlEngine::new(&format!("demo-{tag}-decode-{r}"), buffers)
        })?;
        send_rank(&mut s, &run)?;
    }
    Ok(String::new())
}

#[cfg(test)]
#[path = "nixl_tests.rs"]
mod tests;
