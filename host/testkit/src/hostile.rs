//! A registry that misbehaves on purpose, on loopback: what no real registry can be made to do.
//! Each [`Misbehaviour`] is one attack or one breakage pinset must survive — bodies that never
//! end, bytes that trickle, huge tokens, lying digests and sizes, redirect and 401 loops, a token
//! realm on another host — and [`Hostile::seen`] records every request it got (its path and its
//! `Authorization` header), so a test can say what pinset sent where.
//!
//! Plain blocking sockets, one thread per connection: a misbehaviour that never ends ends when
//! pinset hangs up (the write fails) or when the server is dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the registry answers every `/v2/` request (a token realm it names answers `/token`).
#[derive(Clone, Debug)]
pub enum Misbehaviour {
    /// `200` with a chunked body that never ends.
    EndlessBody,
    /// `200` with a `Content-Length` of a terabyte (and then an endless body).
    HugeLength,
    /// `200`, headers at once, then the body one byte a second, forever.
    Trickle,
    /// `401` asking for a bearer token; the token service answers an endless JSON string.
    HugeToken,
    /// `401` asking for a token; the token is given; the registry refuses it with `401` again.
    AuthLoop,
    /// `302` to itself, forever.
    RedirectLoop,
    /// `401` asking for a token from `realm` (another server: see what it is sent).
    Realm(String),
    /// `200` with this body (a manifest, by any digest it is asked for: a lying registry).
    Serve { content_type: String, body: Vec<u8> },
    /// The first misbehaviour whose key the request's path contains (`/manifests/`,
    /// `/blobs/`): an honest manifest over a hostile blob. `200 {}` when none does (`/v2/`).
    Routes(Vec<(String, Misbehaviour)>),
}

/// What one request carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub user_agent: Option<String>,
}

/// The server; stops accepting when dropped.
pub struct Hostile {
    pub addr: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Hostile {
    pub fn start(how: Misbehaviour) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log, stopped, me) = (seen.clone(), stop.clone(), addr.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (how, log, me) = (how.clone(), log.clone(), me.clone());
                std::thread::spawn(move || serve(stream, &how, &log, &me));
            }
        });
        Hostile { addr, seen, stop }
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Read one request's head (at most 64 KiB); what it asked.
fn request(stream: &TcpStream) -> Option<Seen> {
    let mut reader = BufReader::new(stream.try_clone().ok()?.take(64 << 10));
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let (mut authorization, mut user_agent) = (None, None);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).ok()? == 0 || header.trim().is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            continue;
        };
        let value = Some(value.trim().to_string());
        match name.to_ascii_lowercase().as_str() {
            "authorization" => authorization = value,
            "user-agent" => user_agent = value,
            _ => {}
        }
    }
    Some(Seen {
        method,
        path,
        authorization,
        user_agent,
    })
}

fn serve(mut stream: TcpStream, how: &Misbehaviour, log: &Mutex<Vec<Seen>>, me: &str) {
    let Some(seen) = request(&stream) else {
        return;
    };
    log.lock().unwrap().push(seen.clone());
    let _ = respond(&mut stream, how, &seen, me);
}

fn respond(
    stream: &mut TcpStream,
    how: &Misbehaviour,
    seen: &Seen,
    me: &str,
) -> std::io::Result<()> {
    let token_path = seen.path.starts_with("/token");
    match how {
        Misbehaviour::EndlessBody => endless(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nTransfer-Encoding: chunked\r\n\r\n",
        ),
        Misbehaviour::HugeLength => endless(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nContent-Length: 1099511627776\r\n\r\n",
        ),
        Misbehaviour::Trickle => trickle(stream),
        Misbehaviour::HugeToken if token_path => endless(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        ),
        Misbehaviour::AuthLoop if token_path => answer(
            stream,
            "200 OK",
            "application/json",
            br#"{"token":"t"}"#,
            "",
        ),
        Misbehaviour::HugeToken | Misbehaviour::AuthLoop => {
            challenge(stream, &format!("http://{me}/token"))
        }
        Misbehaviour::Realm(realm) => challenge(stream, realm),
        Misbehaviour::RedirectLoop => answer(
            stream,
            "302 Found",
            "text/plain",
            b"",
            &format!("Location: {}\r\n", seen.path),
        ),
        Misbehaviour::Serve { content_type, body } => {
            answer(stream, "200 OK", content_type, body, "")
        }
        Misbehaviour::Routes(routes) => match routes.iter().find(|(k, _)| seen.path.contains(k)) {
            Some((_, how)) => respond(stream, how, seen, me),
            None => answer(stream, "200 OK", "application/json", b"{}", ""),
        },
    }
}

fn answer(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    headers: &str,
) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)
}

fn challenge(stream: &mut TcpStream, realm: &str) -> std::io::Result<()> {
    let header = format!("WWW-Authenticate: Bearer realm=\"{realm}\",service=\"hostile\"\r\n");
    answer(
        stream,
        "401 Unauthorized",
        "application/json",
        b"{}",
        &header,
    )
}

/// `head`, then chunks of `{"a":"aaaa…` for as long as the reader takes them.
fn endless(stream: &mut TcpStream, head: &str) -> std::io::Result<()> {
    stream.write_all(head.as_bytes())?;
    let chunked = head.contains("chunked");
    let chunk = vec![b'a'; 64 << 10];
    let mut first = true;
    loop {
        let data: &[u8] = if first { b"{\"token\":\"" } else { &chunk };
        first = false;
        if chunked {
            write!(stream, "{:x}\r\n", data.len())?;
            stream.write_all(data)?;
            stream.write_all(b"\r\n")?;
        } else {
            stream.write_all(data)?;
        }
    }
}

/// Headers at once, then one byte a second.
fn trickle(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nTransfer-Encoding: chunked\r\n\r\n")?;
    loop {
        stream.write_all(b"1\r\n{\r\n")?;
        stream.flush()?;
        std::thread::sleep(Duration::from_secs(1));
    }
}
