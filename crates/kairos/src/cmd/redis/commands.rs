//! Redis commands → Tiga operations, and operation outputs → Redis replies.
//!
//! Every command that touches data becomes one or more [`Op`]s (one per key: `MGET a b` is two
//! GETs) with a [`Shape`] saying how their outputs make the command's reply. Commands that
//! touch no data (PING, ECHO, SELECT 0, INFO, CLIENT …) become a [`DataCmd`] with no operations
//! and a fixed reply, so that inside MULTI they queue and answer at EXEC like any other. The
//! connection-level commands (MULTI, EXEC, DISCARD, WATCH, HELLO, QUIT, CLIENT SETNAME) are
//! [`Command`] variants the connection handles itself.
//!
//! Errors found while parsing a command (unknown command, wrong number of arguments, a bad
//! integer argument, an unsupported option) are [`Command::Error`]: answered at once, and
//! inside MULTI they make EXEC answer `EXECABORT`, as in Redis.

use super::resp::Reply;
use kairos_tiga::ops::{Op, OpKind, OpOutput};

/// How a command's operation outputs form its reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// The one operation's output.
    One,
    /// SET … NX: 1 → OK, 0 → nil.
    SetNxOk,
    /// The sum of integer outputs (DEL, EXISTS).
    Sum,
    /// An array of the outputs (MGET).
    Array,
    /// OK unless an operation failed (MSET).
    AllOk,
    /// No operations: this reply.
    Fixed(Reply),
}

/// A command that runs as (part of) a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataCmd {
    pub ops: Vec<Op>,
    pub shape: Shape,
}

impl DataCmd {
    fn fixed(reply: Reply) -> Self {
        DataCmd { ops: Vec::new(), shape: Shape::Fixed(reply) }
    }

    /// What it holds while queued in a MULTI: its operations' keys and arguments, or its
    /// fixed reply's bytes (ECHO's argument).
    pub fn queued_bytes(&self) -> usize {
        let fixed = match &self.shape {
            Shape::Fixed(Reply::Bulk(b)) => b.len(),
            Shape::Fixed(Reply::Simple(s) | Reply::Error(s)) => s.len(),
            _ => 0,
        };
        fixed + self.ops.iter().map(Op::payload_bytes).sum::<usize>()
    }
}

/// A parsed command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Data(DataCmd),
    Multi,
    Exec,
    Discard,
    Watch,
    Quit,
    /// HELLO with the protocol version asked for (none: keep the current one) and a name.
    Hello {
        proto: Option<i64>,
        name: Option<Vec<u8>>,
    },
    ClientSetName(Vec<u8>),
    ClientGetName,
    Error(String),
}

/// What a connection knows that some replies depend on.
pub struct ConnInfo<'a> {
    pub id: u64,
    pub name: Option<&'a [u8]>,
    pub info: &'a str,
}

fn lower(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_lowercase()
}

fn arity(name: &str) -> Command {
    Command::Error(format!("ERR wrong number of arguments for '{name}' command"))
}

fn not_integer() -> Command {
    Command::Error("ERR value is not an integer or out of range".into())
}

/// An integer argument, as Redis parses one.
fn int_arg(b: &[u8]) -> Option<i64> {
    kairos_tiga::ops::parse_int(b)
}

fn data(ops: Vec<Op>, shape: Shape) -> Command {
    Command::Data(DataCmd { ops, shape })
}

fn fixed(reply: Reply) -> Command {
    Command::Data(DataCmd::fixed(reply))
}

/// The Redis version the gateway reports (the command set it follows).
pub const REDIS_VERSION: &str = "7.0.0";

/// Parses `args` (non-empty; the first is the command name).
pub fn parse(args: &[Vec<u8>], conn: &ConnInfo<'_>) -> Command {
    let name = lower(&args[0]);
    let rest = &args[1..];
    let n = rest.len();
    let key = |i: usize| rest[i].clone();
    match name.as_str() {
        "get" if n == 1 => data(vec![Op::new(key(0), OpKind::Get)], Shape::One),
        "strlen" if n == 1 => data(vec![Op::new(key(0), OpKind::Strlen)], Shape::One),
        "set" if n >= 2 => {
            let opts: Vec<String> = rest[2..].iter().map(|o| lower(o)).collect();
            match opts.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                [] => data(vec![Op::new(key(0), OpKind::Set(key(1)))], Shape::One),
                ["nx"] => data(vec![Op::new(key(0), OpKind::SetNx(key(1)))], Shape::SetNxOk),
                _ => Command::Error(
                    "ERR syntax error (Kairos supports SET key value [NX]; no expiry, XX, GET or KEEPTTL)".into(),
                ),
            }
        }
        "setnx" if n == 2 => data(vec![Op::new(key(0), OpKind::SetNx(key(1)))], Shape::One),
        "append" if n == 2 => data(vec![Op::new(key(0), OpKind::Append(key(1)))], Shape::One),
        "incr" if n == 1 => data(vec![Op::new(key(0), OpKind::IncrBy(1))], Shape::One),
        "decr" if n == 1 => data(vec![Op::new(key(0), OpKind::IncrBy(-1))], Shape::One),
        "incrby" | "decrby" if n == 2 => {
            let by = int_arg(&rest[1]);
            let by = if name == "decrby" { by.and_then(i64::checked_neg) } else { by };
            match by {
                Some(by) => data(vec![Op::new(key(0), OpKind::IncrBy(by))], Shape::One),
                None => not_integer(),
            }
        }
        "del" | "unlink" if n >= 1 => data(rest.iter().map(|k| Op::new(k.clone(), OpKind::Del)).collect(), Shape::Sum),
        "exists" if n >= 1 => data(rest.iter().map(|k| Op::new(k.clone(), OpKind::Exists)).collect(), Shape::Sum),
        "mget" if n >= 1 => data(rest.iter().map(|k| Op::new(k.clone(), OpKind::Get)).collect(), Shape::Array),
        "mset" if n >= 2 && n.is_multiple_of(2) => {
            data(rest.chunks(2).map(|kv| Op::new(kv[0].clone(), OpKind::Set(kv[1].clone()))).collect(), Shape::AllOk)
        }
        "ping" if n == 0 => fixed(Reply::Simple("PONG".into())),
        "ping" if n == 1 => fixed(Reply::Bulk(rest[0].clone())),
        "echo" if n == 1 => fixed(Reply::Bulk(rest[0].clone())),
        "select" if n == 1 => match int_arg(&rest[0]) {
            Some(0) => fixed(Reply::ok()),
            Some(_) => Command::Error("ERR DB index is out of range (Kairos has one database, 0)".into()),
            None => not_integer(),
        },
        "multi" if n == 0 => Command::Multi,
        "exec" if n == 0 => Command::Exec,
        "discard" if n == 0 => Command::Discard,
        "watch" if n >= 1 => Command::Watch,
        "unwatch" if n == 0 => fixed(Reply::ok()),
        "quit" => Command::Quit,
        "hello" => {
            let proto = match rest.first() {
                None => None,
                Some(p) => match int_arg(p) {
                    Some(v) => Some(v),
                    None => return Command::Error("ERR Protocol version is not an integer or out of range".into()),
                },
            };
            let mut name_arg = None;
            let mut i = 1;
            while i < n {
                match lower(&rest[i]).as_str() {
                    "setname" if i + 1 < n => {
                        name_arg = Some(rest[i + 1].clone());
                        i += 2;
                    }
                    "auth" => return Command::Error("ERR AUTH is not supported: Kairos has no users".into()),
                    _ => return Command::Error("ERR Syntax error in HELLO option".into()),
                }
            }
            Command::Hello { proto, name: name_arg }
        }
        "client" if n >= 1 => match lower(&rest[0]).as_str() {
            "setname" if n == 2 => {
                if rest[1].iter().any(|b| *b <= b' ' || *b > b'~') {
                    Command::Error("ERR Client names cannot contain spaces, newlines or special characters.".into())
                } else {
                    Command::ClientSetName(rest[1].clone())
                }
            }
            "getname" if n == 1 => Command::ClientGetName,
            "id" if n == 1 => fixed(Reply::Int(conn.id as i64)),
            "setinfo" if n == 3 => fixed(Reply::ok()),
            "info" if n == 1 => {
                let name = conn.name.map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default();
                fixed(Reply::Bulk(format!("id={} name={name} db=0\n", conn.id).into_bytes()))
            }
            other => Command::Error(format!(
                "ERR unknown subcommand '{other}'. Kairos supports CLIENT SETNAME, GETNAME, ID, INFO, SETINFO."
            )),
        },
        "info" if n <= 1 => fixed(Reply::Bulk(conn.info.as_bytes().to_vec())),
        // Enough for redis-cli (hints) and client libraries that probe: no command table.
        "command" => match rest.first().map(|s| lower(s)).as_deref() {
            None | Some("docs") | Some("info") => fixed(Reply::Array(Vec::new())),
            Some("count") => fixed(Reply::Int(0)),
            Some(other) => Command::Error(format!("ERR unknown subcommand '{other}'. Try COMMAND HELP.")),
        },
        // redis-benchmark asks for `save` and `appendonly` before it starts.
        "config" if n == 2 && lower(&rest[0]) == "get" => match lower(&rest[1]).as_str() {
            "save" => fixed(Reply::Map(vec![(Reply::bulk("save"), Reply::bulk(""))])),
            "appendonly" => fixed(Reply::Map(vec![(Reply::bulk("appendonly"), Reply::bulk("no"))])),
            _ => fixed(Reply::Map(Vec::new())),
        },
        "get" | "strlen" | "set" | "setnx" | "append" | "incr" | "decr" | "incrby" | "decrby" | "del" | "unlink"
        | "exists" | "mget" | "mset" | "ping" | "echo" | "select" | "multi" | "exec" | "discard" | "watch"
        | "unwatch" | "info" | "client" | "config" => arity(&name),
        _ => {
            let shown: Vec<String> =
                rest.iter().take(8).map(|a| format!("'{}'", String::from_utf8_lossy(&a[..a.len().min(64)]))).collect();
            Command::Error(format!(
                "ERR unknown command '{}', with args beginning with: {}",
                String::from_utf8_lossy(&args[0][..args[0].len().min(64)]),
                shown.join(" ")
            ))
        }
    }
}

fn output_reply(o: &OpOutput) -> Reply {
    match o {
        OpOutput::Ok => Reply::ok(),
        OpOutput::Nil => Reply::Nil,
        OpOutput::Int(n) => Reply::Int(*n),
        OpOutput::Bulk(b) => Reply::Bulk(b.clone()),
        OpOutput::Error(e) => Reply::Error(e.to_string()),
    }
}

/// The reply of a command of `shape` whose operations returned `outputs`.
pub fn reply(shape: &Shape, outputs: &[OpOutput]) -> Reply {
    if let Some(e) = outputs.iter().find(|o| matches!(o, OpOutput::Error(_))) {
        if !matches!(shape, Shape::Array) {
            return output_reply(e);
        }
    }
    match shape {
        Shape::Fixed(r) => r.clone(),
        Shape::One => outputs.first().map_or(Reply::Nil, output_reply),
        Shape::SetNxOk => match outputs.first() {
            Some(OpOutput::Int(1)) => Reply::ok(),
            _ => Reply::Nil,
        },
        Shape::Sum => Reply::Int(outputs.iter().map(|o| if let OpOutput::Int(n) = o { *n } else { 0 }).sum()),
        Shape::Array => Reply::Array(outputs.iter().map(output_reply).collect()),
        Shape::AllOk => Reply::ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    fn p(s: &str) -> Command {
        let args: Vec<Vec<u8>> = s.split(' ').map(|a| a.as_bytes().to_vec()).collect();
        parse(&args, &ConnInfo { id: 7, name: None, info: "# Server\r\n" })
    }

    #[test]
    fn data_commands_map_to_operations() {
        let Command::Data(d) = p("MSET a 1 b 2") else { panic!() };
        assert_eq!(d.ops.len(), 2);
        assert_eq!(d.shape, Shape::AllOk);
        let Command::Data(d) = p("decrby x 5") else { panic!() };
        assert_eq!(d.ops, vec![Op::new(b"x".to_vec(), OpKind::IncrBy(-5))]);
        assert_eq!(p("incrby x abc"), Command::Error("ERR value is not an integer or out of range".into()));
        assert_eq!(p("get"), Command::Error("ERR wrong number of arguments for 'get' command".into()));
        assert!(matches!(p("FLUSHALL now"), Command::Error(e) if e.starts_with("ERR unknown command 'FLUSHALL'")));
        assert_eq!(p("watch a"), Command::Watch);
        assert!(matches!(p("set a b EX 10"), Command::Error(e) if e.starts_with("ERR syntax error")));
        assert_eq!(p("hello 3"), Command::Hello { proto: Some(3), name: None });
        assert_eq!(p("ping"), Command::Data(DataCmd::fixed(Reply::Simple("PONG".into()))));
    }

    #[test]
    fn outputs_form_replies() {
        assert_eq!(reply(&Shape::Sum, &[OpOutput::Int(1), OpOutput::Int(0), OpOutput::Int(1)]), Reply::Int(2));
        assert_eq!(reply(&Shape::SetNxOk, &[OpOutput::Int(0)]), Reply::Nil);
        assert_eq!(
            reply(&Shape::Array, &[OpOutput::Nil, OpOutput::Bulk(b"v".to_vec())]).clone(),
            Reply::Array(vec![Reply::Nil, Reply::bulk("v")])
        );
        let e = reply(&Shape::One, &[OpOutput::Error(kairos_tiga::ops::OpError::NotInteger)]);
        assert_eq!(e, Reply::err("ERR value is not an integer or out of range"));
    }

    proptest::proptest! {
        // Parsing is cheap; enough cases to reach each command's rarer argument shapes.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(50_000))]
        /// Any command a client can send (a known name in any case, or any bytes, with any
        /// arguments) parses to a command or an error reply, never a panic.
        #[test]
        fn any_command_parses_or_is_refused(
            name in proptest::prop_oneof![
                3 => proptest::sample::select(vec![
                    "get", "STRLEN", "set", "SetNx", "append", "incr", "decr", "incrby", "DECRBY", "del", "unlink",
                    "exists", "mget", "mset", "ping", "echo", "select", "multi", "exec", "discard", "watch",
                    "unwatch", "quit", "hello", "client", "info", "command", "config", "save", "dbsize",
                ]).prop_map(|n| n.as_bytes().to_vec()),
                1 => proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
            ],
            rest in proptest::collection::vec(
                proptest::prop_oneof![
                    3 => proptest::sample::select(vec![
                        "nx", "setname", "getname", "id", "info", "setinfo", "get", "auth", "3", "-1", "0", "docs",
                        "count", "9223372036854775807", "-9223372036854775808",
                    ]).prop_map(|a| a.as_bytes().to_vec()),
                    1 => proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
                ],
                0..5,
            ),
        ) {
            let mut args = vec![name];
            args.extend(rest);
            let command = parse(&args, &ConnInfo { id: 1, name: Some(b"c"), info: "" });
            if let Command::Data(d) = &command {
                proptest::prop_assert!(d.ops.len() <= args.len());
            }
        }
    }
}
