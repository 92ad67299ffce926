//! Hostile handshakes (`Hello` messages) over a real socket, refused without a NIXL call.

use std::net::TcpStream;

use kvlayout_connector::handshake::{HandshakeError, Limits, MemRegion, PeerMetadata};
use kvlayout_connector::nixl::Hello;

use crate::common::{group, p_layout, report, IO_TIMEOUT};
use crate::process::{listen, recv_frame, send_frame};

pub(crate) fn nixl_hostile_handshakes_over_a_socket_are_refused() {
    // No NIXL call: the framing and the handshake are checked before any metadata is loaded.
    let layout = p_layout();
    let regions: Vec<MemRegion> = layout
        .extents()
        .iter()
        .enumerate()
        .map(|(i, x)| MemRegion::host(0x7f00_0000_0000 + ((i as u64) << 32), x.end))
        .collect();
    let good = Hello {
        peer: PeerMetadata {
            engine_id: "nixl-hostile".into(),
            groups: vec![group(&layout, 1, 0, regions.clone())],
        },
        agent_metadata: vec![7; 400],
    };
    let bytes = good.encode();
    let hlen = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
    let mut small = good.clone();
    small.peer.groups[0].regions[0].len -= 1;
    let mut variants: Vec<(&str, Vec<u8>)> = vec![
        ("good", bytes.clone()),
        ("empty", Vec::new()),
        ("truncated header", bytes[..6].to_vec()),
        ("truncated handshake", bytes[..8 + hlen / 2].to_vec()),
        ("truncated metadata", bytes[..bytes.len() - 1].to_vec()),
        ("trailing bytes", [&bytes[..], b"x"].concat()),
        ("region smaller than the layout's span", small.encode()),
    ];
    let mut bad_magic = bytes.clone();
    bad_magic[0] ^= 0xff;
    variants.push(("magic", bad_magic));
    let mut huge = bytes.clone();
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    variants.push(("huge length", huge));
    let mut flipped = bytes.clone();
    flipped[8 + 2] ^= 0x01; // the handshake's version
    variants.push(("handshake version", flipped));
    let mut json = bytes.clone();
    json[8 + 20] = b'}'; // inside the handshake's JSON body
    variants.push(("handshake body", json));
    // Every byte of the handshake flipped in turn, each refused or decoded to an equal-or-
    // different value, never a panic.
    let mutants: Vec<Vec<u8>> = (8..8 + hlen)
        .step_by(7)
        .map(|i| {
            let mut m = bytes.clone();
            m[i] = m[i].wrapping_add(0x55);
            m
        })
        .collect();

    // Over a real socket: a sender thread writes each variant as one frame.
    let (listener, port) = listen();
    let all: Vec<Vec<u8>> = variants
        .iter()
        .map(|(_, v)| v.clone())
        .chain(mutants.iter().cloned())
        .collect();
    let count = all.len();
    let sender = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        for v in all {
            send_frame(&mut s, &v);
        }
    });
    listener.set_nonblocking(false).unwrap();
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut refused = 0;
    for i in 0..count {
        let frame = recv_frame(&mut s, 1 << 20).unwrap();
        let got = Hello::decode(&frame, &Limits::default());
        if let Some((what, _)) = variants.get(i) {
            match (*what, got) {
                ("good", Ok(h)) => assert_eq!(h, good),
                ("region smaller than the layout's span", Err(e)) => {
                    assert!(matches!(e, HandshakeError::RegionTooSmall { .. }), "{e}")
                }
                ("magic", Err(e)) => assert!(matches!(e, HandshakeError::BadMagic { .. }), "{e}"),
                ("huge length", Err(e)) => {
                    assert!(matches!(e, HandshakeError::BodyTooLarge { .. }), "{e}")
                }
                (_, Err(_)) => refused += 1,
                (what, Ok(h)) => panic!("{what}: accepted {h:?}"),
            }
        } else if got.is_err() {
            refused += 1;
        }
    }
    sender.join().unwrap();
    report(&format!(
        "nixl hostile handshakes: {refused} of {} malformed or mutated messages refused",
        count - 4
    ));
    assert!(refused >= variants.len() - 4);
}
