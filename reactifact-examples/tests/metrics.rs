//! The `metrics` program, run as built: `--once` prints Prometheus text and exits 0; the
//! server answers `/metrics` with the exposition's content type, any other path with 404, and
//! survives junk — empty, binary, oversized and idle connections.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

const METRICS: &str = env!("CARGO_BIN_EXE_metrics");

// ---------------------------------------------------------------------------------------------
// The Prometheus text format
// ---------------------------------------------------------------------------------------------

/// One sample line: `name{labels} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// A parsed exposition: the samples, and the type each `# TYPE` line gives.
#[derive(Debug, Default)]
struct Exposition {
    samples: Vec<Sample>,
    types: HashMap<String, String>,
}

impl Exposition {
    /// The samples of the metric family `name` (`name`, or `name_bucket`, `name_sum`, …).
    fn family<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| s.name.strip_suffix(suffix) == Some(name))
        })
    }
}

fn is_name(name: &str, colons: bool) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

fn value(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok().filter(|v: &f64| v.is_finite()),
    }
}

/// `name{labels} value [timestamp]`.
fn sample(line: &str) -> Result<Sample, String> {
    let end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..end];
    if !is_name(name, true) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[end..];
    let mut labels = HashMap::new();
    if let Some(mut inside) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = inside.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = inside.find('=').ok_or("a label without =")?;
            let label = &inside[..eq];
            if !is_name(label, false) {
                return Err(format!("bad label name {label:?}"));
            }
            let mut chars = inside[eq + 1..]
                .strip_prefix('"')
                .ok_or("unquoted label value")?
                .char_indices();
            let mut text = String::new();
            let close = loop {
                match chars.next().ok_or("unterminated label value")? {
                    (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                        'n' => text.push('\n'),
                        c @ ('\\' | '"') => text.push(c),
                        c => return Err(format!("bad escape \\{c}")),
                    },
                    (i, '"') => break i,
                    (_, c) => text.push(c),
                }
            };
            labels.insert(label.to_owned(), text);
            inside = &inside[eq + 1..][1 + close + 1..];
            inside = inside.strip_prefix(',').unwrap_or(inside);
        }
    }
    let mut fields = rest.strip_prefix(' ').ok_or("no space before the value")?.split(' ');
    let value = fields
        .next()
        .and_then(value)
        .ok_or_else(|| format!("bad value in {rest:?}"))?;
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<i64>()
            .map_err(|_| format!("bad timestamp {timestamp:?}"))?;
    }
    if fields.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `text` as the Prometheus text format; panics naming the first line that is not.
fn exposition(text: &str) -> Exposition {
    let mut parsed = Exposition::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            if let ["TYPE", name, kind] = words[..] {
                let known = ["counter", "gauge", "histogram", "summary", "untyped"];
                assert!(known.contains(&kind), "unknown type in {line:?}");
                parsed.types.insert(name.to_owned(), kind.to_owned());
            }
            continue;
        }
        match sample(line) {
            Ok(sample) => parsed.samples.push(sample),
            Err(e) => panic!("not a Prometheus sample line ({e}): {line:?}\nin:\n{text}"),
        }
    }
    parsed
}

#[test]
fn the_parser_takes_the_format_and_refuses_what_is_not() {
    let text = "# HELP a_total A.\n# TYPE a_total counter\na_total{kind=\"x\",why=\"q\\\"\\\\\"} 3\nb 1.5e-3 1700000000\nc_bucket{le=\"+Inf\"} 2\n";
    let parsed = exposition(text);
    assert_eq!(parsed.samples.len(), 3);
    assert_eq!(parsed.samples[0].labels["why"], "q\"\\");
    assert_eq!(parsed.types["a_total"], "counter");
    for bad in [
        "a",
        "a x",
        "1a 2",
        "a{b=c} 1",
        "a{b=\"c} 1",
        "a 1 2 3",
        "walkthrough failed: x",
    ] {
        assert!(sample(bad).is_err(), "{bad:?} parsed");
    }
}

// ---------------------------------------------------------------------------------------------
// --once
// ---------------------------------------------------------------------------------------------

/// `metrics --once`: its exit status and its stdout, parsed.
fn once() -> Exposition {
    let out = Command::new(METRICS)
        .arg("--once")
        .env_remove("RUST_LOG")
        .output()
        .expect("the metrics program runs");
    let stdout = String::from_utf8(out.stdout).expect("stdout is UTF-8");
    assert!(
        out.status.success(),
        "metrics --once failed: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    exposition(&stdout)
}

#[test]
fn once_exits_0_and_prints_only_prometheus_text() {
    let parsed = once();
    let rounds: Vec<_> = parsed.family("reactifact_example_rounds_total").collect();
    assert_eq!(rounds.len(), 1, "{parsed:?}");
    assert_eq!(rounds[0].labels["outcome"], "passed");
    assert_eq!(rounds[0].value, 1.0);
    assert_eq!(parsed.types["reactifact_example_rounds_total"], "counter");
}

#[test]
fn once_shows_the_runtimes_commits_deliveries_and_delivery_latency() {
    let parsed = once();
    let committed: Vec<_> = parsed.family("reactifact_generations_committed_total").collect();
    assert!(
        committed.iter().any(|s| s.value > 0.0),
        "no committed generations: {parsed:?}"
    );

    let delivered: f64 = parsed
        .family("reactifact_deliveries_total")
        .filter(|s| s.labels.get("outcome").map(String::as_str) == Some("delivered"))
        .map(|s| s.value)
        .sum();
    // Every case of both passes ends in at least one delivery.
    assert!(delivered >= 2.0, "deliveries with outcome=\"delivered\": {delivered}");

    let latency = "reactifact_delivery_latency_seconds";
    let kind = parsed.types.get(latency).map(String::as_str);
    assert!(
        matches!(kind, Some("histogram" | "summary")),
        "{latency} has type {kind:?}"
    );
    let count: f64 = parsed
        .samples
        .iter()
        .filter(|s| s.name == format!("{latency}_count"))
        .map(|s| s.value)
        .sum();
    assert!(count >= delivered, "{latency}_count {count} < {delivered} deliveries");
    let shaped = parsed
        .family(latency)
        .any(|s| s.labels.contains_key("le") || s.labels.contains_key("quantile"));
    assert!(shaped, "{latency} has neither buckets nor quantiles");
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// The serving program: killed and waited for when dropped, so a failed test leaves nothing.
struct Server {
    child: Child,
    addr: SocketAddr,
    /// The rest of its stdout, held open so that its later lines never meet a closed pipe.
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    /// Starts `metrics --port 0 --rounds 1` and reads the address from its first line.
    fn start() -> Server {
        let mut child = Command::new(METRICS)
            .args(["--port", "0", "--rounds", "1"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the metrics program starts");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut first = String::new();
        stdout.read_line(&mut first).expect("the first line");
        let addr = first
            .trim_end()
            .strip_prefix("serving metrics on http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        Server {
            addr: addr.parse().expect("a socket address"),
            child,
            _stdout: stdout,
        }
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).expect("connects");
        // A guard against a hung test, not a synchronisation: every read below ends when the
        // server closes the connection.
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream
    }

    /// Sends `request` and reads the whole answer (the server closes after it).
    fn send(&self, request: &[u8]) -> Response {
        let mut stream = self.connect();
        stream.write_all(request).expect("the request is sent");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).expect("the answer is read");
        Response::parse(&raw)
    }

    fn get(&self, path: &str) -> Response {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: */*\r\n\r\n", self.addr).as_bytes())
    }

    fn assert_running(&mut self) {
        let status = self.child.try_wait().expect("the child's status");
        assert!(status.is_none(), "the metrics program exited: {status:?}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Response {
    fn parse(raw: &[u8]) -> Response {
        let text = String::from_utf8(raw.to_vec()).expect("the answer is UTF-8");
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no head in {text:?}"));
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap();
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let headers = lines
            .map(|l| {
                let (name, value) = l.split_once(':').unwrap_or_else(|| panic!("bad header {l:?}"));
                (name.to_ascii_lowercase(), value.trim().to_owned())
            })
            .collect::<HashMap<_, _>>();
        let length: usize = headers["content-length"].parse().expect("a content length");
        assert_eq!(headers["connection"], "close");
        let response = Response {
            status,
            headers,
            body: body.to_owned(),
        };
        assert!(
            response.body.is_empty() || response.body.len() == length,
            "content-length {length}, body of {} bytes",
            response.body.len()
        );
        response
    }
}

#[test]
fn the_server_answers_metrics_with_the_exposition_format_and_404_elsewhere() {
    let mut server = Server::start();

    let metrics = server.get("/metrics");
    assert_eq!(metrics.status, 200, "{metrics:?}");
    assert_eq!(metrics.headers["content-type"], "text/plain; version=0.0.4");
    exposition(&metrics.body);

    let with_query = server.get("/metrics?name[]=reactifact_outbox_intents");
    assert_eq!(with_query.status, 200, "{with_query:?}");

    let head = server.send(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "a HEAD answer has no body: {head:?}");

    for path in ["/other", "/", "/metrics/", "/METRICS"] {
        let other = server.get(path);
        assert_eq!(other.status, 404, "GET {path}: {other:?}");
    }
    let post = server.send(b"POST /metrics HTTP/1.1\r\nHost: x\r\ncontent-length: 0\r\n\r\n");
    assert_eq!(post.status, 405, "{post:?}");
    assert_eq!(post.headers["allow"], "GET, HEAD");
    // HTTP/1.0 clients (and bare `\n` line ends) are answered too.
    assert_eq!(server.send(b"GET /metrics HTTP/1.0\n\n").status, 200);

    server.assert_running();
}

#[test]
fn junk_requests_are_refused_and_the_server_serves_on() {
    let mut server = Server::start();

    // An idle client that never sends anything does not hold up the others.
    let idle = server.connect();

    for junk in [
        &b"\x00\xff\xfe\x16\x03\x01 not http\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET /metrics SPDY/3\r\n\r\n",
        b"GET  /metrics HTTP/1.1\r\n\r\n",
        b"\r\n\r\n",
        "GET /m\u{e9}triques HTTP/1.1\r\n\r\n".as_bytes(),
    ] {
        let answer = server.send(junk);
        assert!(
            matches!(answer.status, 400 | 404),
            "{:?}: {answer:?}",
            String::from_utf8_lossy(junk)
        );
    }

    // A client that closes its side at once, with nothing sent: a 400, no crash.
    let mut empty = server.connect();
    empty.shutdown(Shutdown::Write).unwrap();
    let mut raw = Vec::new();
    empty.read_to_end(&mut raw).expect("the answer is read");
    assert_eq!(Response::parse(&raw).status, 400);

    // A client that hangs up before any answer.
    drop(server.connect());
    let mut rude = server.connect();
    rude.write_all(b"GET /metr").unwrap();
    drop(rude);

    // A head larger than the server reads: it answers 431 — or, having stopped reading, its
    // close resets the connection before the answer is read. Either way it serves on.
    let mut huge = server.connect();
    let _ = huge.write_all(&vec![b'A'; 64 * 1024]);
    let mut raw = Vec::new();
    if huge.read_to_end(&mut raw).is_ok() && !raw.is_empty() {
        assert_eq!(Response::parse(&raw).status, 431);
    }

    let metrics = server.get("/metrics");
    assert_eq!(metrics.status, 200, "{metrics:?}");
    exposition(&metrics.body);
    server.assert_running();
    drop(idle);
}

#[test]
fn bad_options_exit_2_with_a_message() {
    for args in [
        &["--port"][..],
        &["--port", "65536"],
        &["--rounds", "0"],
        &["--once", "--port", "0"],
        &["--frobnicate"],
    ] {
        let out = Command::new(METRICS).args(args).output().expect("runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("metrics: "), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
