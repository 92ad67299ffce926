//! The soak test's peer processes: the prefill child (fills and registers its cache, sends
//! its `Hello`, waits), the agents' options, accepting a peer's `Hello`, and the restarted
//! peer whose changed layout is refused.

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use kvlayout_connector::engine::TransferEngine;
use kvlayout_connector::handshake::{HandshakeError, KnownPeers, Limits, PeerMetadata};
use kvlayout_connector::nixl::{Hello, NixlEngine, NixlOptions};

use crate::common::{group, report};
use crate::process::{child_watchdog, connect_parent, recv_frame, send_frame, Peer};
use crate::soak::SOAK;
use crate::soak_cache::{prefill_cache, PEERS, RESTARTED};

/// A peer child's index into `PEERS`, or `restarted`.
pub(crate) const WHICH: &str = "KVLAYOUT_SOAK_PEER";
/// The peer stopped and killed midway: `soak-hnd16`, instance 1.
pub(crate) const VICTIM: usize = 1;

/// A prefill peer: fills and registers its cache, sends its `Hello`, and takes the pulls'
/// notifications until the parent closes the socket or kills it (at most `CHILD_LIFETIME`).
pub(crate) fn soak_peer_child() {
    child_watchdog();
    let which = std::env::var(WHICH).unwrap();
    let spec = match which.as_str() {
        "restarted" => RESTARTED,
        i => PEERS[i.parse::<usize>().unwrap()].clone(),
    };
    let layout = spec.layout();
    let mut engine =
        NixlEngine::with_options(spec.engine_id, prefill_cache(&spec), &options()).unwrap();
    let hello = Hello {
        peer: PeerMetadata {
            engine_id: spec.engine_id.into(),
            groups: vec![group(&layout, spec.tp_size, spec.tp_rank, engine.regions())],
        },
        agent_metadata: engine.local_metadata().unwrap(),
    };
    let mut s = connect_parent();
    send_frame(&mut s, &hello.encode());
    // Until the parent closes the socket, kills this process, or the watchdog ends it: the
    // pulls' notifications are taken every 100 ms, as a prefill engine frees blocks on them.
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut notes = 0;
    while let Err(e) = recv_frame(&mut s, 16) {
        if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            break;
        }
        notes += engine.notifications().unwrap().len();
    }
    report(&format!("{}: {notes} notifications", spec.engine_id));
}

/// Six agents share the cores: each progress thread pauses 1 ms between rounds instead of
/// keeping a core busy.
pub(crate) fn options() -> NixlOptions {
    NixlOptions {
        progress_thread: true,
        progress_delay_us: 1000,
    }
}

/// Accepts one peer's connection and decodes its `Hello`.
pub(crate) fn hello_of(peer: &mut Peer, listener: &TcpListener) -> (Hello, TcpStream) {
    let mut s = peer.accept(listener);
    let bytes = recv_frame(&mut s, 1 << 20).unwrap();
    (Hello::decode(&bytes, &Limits::default()).unwrap(), s)
}

/// The restarted peer's connect (`RESTARTED`: `soak-hnd16` with NHD pages) is refused by
/// `known`, naming the group, the order field and both values.
pub(crate) fn restarted_is_refused(listener: &TcpListener, known: &mut KnownPeers) {
    let port = listener.local_addr().unwrap().port();
    let mut restarted = Peer::spawn(SOAK, "soak-peer", port, &[(WHICH, "restarted")]);
    let (hello, _s) = hello_of(&mut restarted, listener);
    match known.admit(&hello.peer) {
        Err(HandshakeError::PeerChanged {
            peer,
            group,
            field,
            before,
            after,
        }) => {
            assert_eq!(
                (peer.as_str(), group.as_str()),
                (RESTARTED.engine_id, "attn")
            );
            assert!(
                field.starts_with("layout.") && field.contains("order"),
                "{field}"
            );
            assert_eq!(
                (before.as_str(), after.as_str()),
                ("LBHNC", "LBNHC"),
                "{field}"
            );
            report(&format!(
                "nixl soak: restarted peer refused: {}",
                known.admit(&hello.peer).unwrap_err()
            ));
        }
        other => panic!("a changed layout was taken: {other:?}"),
    }
    restarted.finish();
}
