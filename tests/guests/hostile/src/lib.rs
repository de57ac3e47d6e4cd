//! A hostile test plugin for Herald's containment tests (never an example to copy).
//! Its `transform` and `sign` misbehave as the event type's last segment says
//! (`x.print`, `x.panic`, …), so one file serves every case in one gateway:
//! - `print`: writes to stdout and stderr, then sends the request unchanged;
//! - `panic`: prints, then `panic!`s (its abort message goes to stderr);
//! - `exit`: `std::process::exit(3)` (WASI reports any failing status as 1);
//! - `socket`: tries a TCP connection (not granted), reports the error it got;
//! - `spin`: loops until Herald stops it;
//! - `burn`: legal work: `burn_iterations` (its config) turns of a loop, then behaves
//!   (the benchmarks calibrate it to a share of the time budget);
//! - `alloc`: allocates until the memory cap stops it;
//! - `huge`: sends an 8 MiB body (over the output cap);
//! - anything else: behaves (sends the request unchanged; `sign` adds `x-hostile: ok`).

use std::io::Write as _;

use plugin_sdk::{DeliveryContext, Header, Hooks, Plugin, Request, TransformResult};

struct Hostile;

impl Plugin for Hostile {
    const HOOKS: Hooks = Hooks::TRANSFORM.union(Hooks::SIGN);

    fn transform(ctx: &DeliveryContext, mut req: Request) -> Result<TransformResult, String> {
        misbehave(ctx)?;
        if ctx.event_type.ends_with(".huge") {
            req.body = vec![b'x'; 8 << 20];
        }
        Ok(TransformResult::Send(req))
    }

    fn sign(ctx: &DeliveryContext, _secrets: &[Vec<u8>], _req: &Request) -> Result<Vec<Header>, String> {
        misbehave(ctx)?;
        Ok(vec![("x-hostile".to_string(), "ok".to_string())])
    }
}

fn misbehave(ctx: &DeliveryContext) -> Result<(), String> {
    match ctx.event_type.rsplit('.').next().unwrap_or_default() {
        "print" => {
            println!("hello from {} on stdout", ctx.attempt_id);
            eprintln!("hello from {} on stderr", ctx.attempt_id);
            let _ = std::io::stdout().flush();
        }
        "panic" => {
            println!("about to panic");
            panic!("hostile plugin panics on {}", ctx.event_id);
        }
        "exit" => std::process::exit(3),
        // A plugin that explains itself before failing (its log lines show in the API).
        "fail" => {
            plugin_sdk::log::warn(&format!("refusing {}", ctx.event_id));
            return Err(format!("refused {}", ctx.event_id));
        }
        "socket" => match std::net::TcpStream::connect("127.0.0.1:9") {
            Ok(_) => return Err("socket: connected, which must never happen".to_string()),
            Err(e) => return Err(format!("socket: {e}")),
        },
        "burn" => {
            let turns: u64 = plugin_sdk::config("burn_iterations").and_then(|n| n.parse().ok()).unwrap_or(0);
            let mut n = 0u64;
            for _ in 0..turns {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "alloc" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        "spin" => {
            let mut n = 0u64;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        _ => {}
    }
    Ok(())
}

plugin_sdk::export!(Hostile);
