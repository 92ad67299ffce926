//! Processes and sockets: [`Peer`] (a child run of this binary, killed and reaped on drop),
//! the loopback listener and the parent connection, the child watchdog, and length-prefixed
//! frames.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{report, CHILD_LIFETIME, IO_TIMEOUT, PORT, ROLE};

// ---------------------------------------------------------------------------------------

/// A child run of this binary: killed and reaped on drop; its output kept for messages.
pub(crate) struct Peer {
    pub(crate) child: Child,
    output: Arc<Mutex<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
}

impl Peer {
    /// Runs test `test` of this binary as `role`, told the parent's `port`, with `env`.
    pub(crate) fn spawn(test: &str, role: &str, port: u16, env: &[(&str, &str)]) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", test, "--test-threads=1", "--nocapture"])
            .env(ROLE, role)
            .env(PORT, port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        // Both streams into one buffer (the child's harness prints `test result:` lines,
        // which must not reach this process's output).
        let mut streams: Vec<Box<dyn Read + Send>> = vec![
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        let sink = Arc::clone(&output);
        let reader = std::thread::spawn(move || {
            let handles: Vec<JoinHandle<()>> = streams
                .drain(..)
                .map(|mut s| {
                    let sink = Arc::clone(&sink);
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        while let Ok(n) = s.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            sink.lock().unwrap().extend_from_slice(&buf[..n]);
                        }
                    })
                })
                .collect();
            for h in handles {
                let _ = h.join();
            }
        });
        Peer {
            child,
            output,
            reader: Some(reader),
        }
    }

    /// The child's output so far (its last 4000 bytes).
    pub(crate) fn output(&self) -> String {
        let out = self.output.lock().unwrap();
        let from = out.len().saturating_sub(4000);
        String::from_utf8_lossy(&out[from..]).into_owned()
    }

    /// Accepts the child's connection on `listener`, failing early if the child exits.
    pub(crate) fn accept(&mut self, listener: &TcpListener) -> TcpStream {
        listener.set_nonblocking(true).unwrap();
        let start = Instant::now();
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
                    return s;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        panic!(
                            "child exited ({status}) before connecting:\n{}",
                            self.finish()
                        );
                    }
                    assert!(
                        start.elapsed() < IO_TIMEOUT,
                        "child did not connect within {IO_TIMEOUT:?}:\n{}",
                        self.output()
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    }

    /// Waits (bounded) for the child to exit: its status, or `None` past the bound (the drop
    /// kills it).
    pub(crate) fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Sends signal `sig` (`libc::SIGSTOP`, `libc::SIGKILL`) to the child.
    pub(crate) fn signal(&self, sig: i32) {
        let pid = self.child.id() as i32;
        // SAFETY: `kill` takes a pid and a signal number and touches no memory of this
        // process; the pid is that of a child this process spawned and has not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig} to {pid}");
    }

    /// Kills and reaps the child, joins the output reader; the output.
    pub(crate) fn finish(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.output()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// This process's resident memory in KiB (`/proc/self/statm`; 0 where it is not readable).
pub(crate) fn resident_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// Listens on an ephemeral port of 127.0.0.1.
pub(crate) fn listen() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// The child side: connects to the parent's port.
pub(crate) fn connect_parent() -> TcpStream {
    let port: u16 = std::env::var(PORT).unwrap().parse().unwrap();
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// A child never outlives [`CHILD_LIFETIME`].
pub(crate) fn child_watchdog() {
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        report("nixl test child: watchdog exit");
        std::process::exit(9);
    });
}

pub(crate) fn send_frame(s: &mut TcpStream, bytes: &[u8]) {
    s.write_all(&(bytes.len() as u64).to_le_bytes()).unwrap();
    s.write_all(bytes).unwrap();
    s.flush().unwrap();
}

/// One length-prefixed frame of at most `max` bytes.
pub(crate) fn recv_frame(s: &mut TcpStream, max: u64) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    s.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > max {
        return Err(std::io::Error::other(format!(
            "frame of {len} bytes over {max}"
        )));
    }
    let mut v = vec![0u8; len as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}
