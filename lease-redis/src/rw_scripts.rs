//! The Lua scripts of read/write leases (C19): one hash per key, in the
//! key's hash slot, holding its writer, its readers and its waiting
//! writers, each field with its own expiry in server milliseconds (the
//! script reads the server's clock with TIME). Expired fields are dropped by
//! the next script that looks; the hash itself expires with its last live
//! field. The last writer's token lives in a key of its own without expiry
//! (a reader carries it), tokens come from the plain lease's fence counter.
//!
//! Fields: `w` = `<expiry>:<owner>:<token>:<label>`; `r:<owner>` =
//! `<expiry>:<token>:<label>`; `q:<writer id>` = `<expiry>`.

use std::sync::LazyLock;

use redis::Script;

/// The prelude every script starts with: the server's time in ms, and a
/// pass over the hash that drops expired fields and notes what is live:
/// the writer's expiry (`wexp`), the latest expiry of writer and readers
/// (`busy`), the earliest of waiting writers (`qexp`) and the latest of all
/// (`last`).
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HGETALL', KEYS[1])
local wexp, qexp, busy, last = nil, nil, 0, 0
for i = 1, #h, 2 do
  local f, v = h[i], h[i + 1]
  local exp = tonumber(string.match(v, '^(%d+)')) or 0
  if exp <= now then
    redis.call('HDEL', KEYS[1], f)
  else
    local kind = string.sub(f, 1, 1)
    if kind == 'w' then wexp = exp end
    if kind == 'q' then
      if not qexp or exp < qexp then qexp = exp end
    elseif exp > busy then
      busy = exp
    end
    if exp > last then last = exp end
  end
end
";

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

/// KEYS: hash, fence counter, writer epoch, this owner's cancel tombstone.
/// ARGV: owner, ttl ms, label. Returns {1, token, writer epoch} when taken;
/// {0, remaining ms, 0} while a writer holds the key or waits for it;
/// {0, -3, 0} when this owner's acquire was cancelled (see [`CANCEL`]).
pub(crate) static READ: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('EXISTS', KEYS[4]) == 1 then return {0, -3, 0} end
if wexp then return {0, wexp - now, 0} end
if qexp then return {0, qexp - now, 0} end
local token = redis.call('INCR', KEYS[2])
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], exp .. ':' .. token .. ':' .. ARGV[3])
if exp > last then last = exp end
redis.call('PEXPIREAT', KEYS[1], last)
return {1, token, tonumber(redis.call('GET', KEYS[3]) or '0')}
",
    )
});

/// KEYS: hash, fence counter, writer epoch, this owner's cancel tombstone.
/// ARGV: owner, ttl ms, label, waiting writer's id ('' for none). Returns
/// {1, token} when taken (the waiting record removed); {0, remaining ms}
/// while readers or a writer hold the key, having recorded the waiting
/// writer until ttl from now; {0, -3} when this owner's acquire was cancelled.
pub(crate) static WRITE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('EXISTS', KEYS[4]) == 1 then return {0, -3} end
local ttl = tonumber(ARGV[2])
if busy > 0 then
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[1], 'q:' .. ARGV[4], now + ttl)
    if now + ttl > last then last = now + ttl end
    redis.call('PEXPIREAT', KEYS[1], last)
  end
  return {0, busy - now}
end
local token = redis.call('INCR', KEYS[2])
local exp = now + ttl
redis.call('HSET', KEYS[1], 'w', exp .. ':' .. ARGV[1] .. ':' .. token .. ':' .. ARGV[3])
if ARGV[4] ~= '' then redis.call('HDEL', KEYS[1], 'q:' .. ARGV[4]) end
redis.call('SET', KEYS[3], token)
if exp > last then last = exp end
redis.call('PEXPIREAT', KEYS[1], last)
return {1, token}
",
    )
});

/// The compare every extend and release makes: the field of the lease holds
/// its owner and token. ARGV[1]: field; ARGV[2]: owner; ARGV[3]: token.
/// Sets `v` (the field's value) and `ok`.
const HELD: &str = r"
local v = redis.call('HGET', KEYS[1], ARGV[1])
local ok = false
if v then
  local exp, rest = string.match(v, '^(%d+):(.*)$')
  if exp and tonumber(exp) > now then
    if ARGV[1] == 'w' then
      ok = string.find(rest, ARGV[2] .. ':' .. ARGV[3] .. ':', 1, true) == 1
    else
      ok = string.find(rest, ARGV[3] .. ':', 1, true) == 1
    end
  end
end
";

/// KEYS: hash. ARGV: field, owner, token, ttl ms. Returns 1 if extended.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    script(&format!(
        r"{HELD}
if not ok then return 0 end
local exp = now + tonumber(ARGV[4])
local _, rest = string.match(v, '^(%d+):(.*)$')
redis.call('HSET', KEYS[1], ARGV[1], exp .. ':' .. rest)
if exp > last then last = exp end
redis.call('PEXPIREAT', KEYS[1], last)
return 1
"
    ))
});

/// KEYS: hash. ARGV: field, owner, token, channel, wake message. Returns 1
/// if released (and the waiters woken).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(&format!(
        r"{HELD}
if not ok then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
pcall(redis.call, 'PUBLISH', ARGV[4], ARGV[5])
return 1
"
    ))
});

/// KEYS: hash. ARGV: waiting writer's id, channel, wake message. Removes the
/// record (waking the readers it kept out).
pub(crate) static WITHDRAW: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('HDEL', KEYS[1], 'q:' .. ARGV[1]) == 1 then
  pcall(redis.call, 'PUBLISH', ARGV[2], ARGV[3])
end
return 1
",
    )
});

/// Cancels one owner's read or write acquire whose outcome is unknown (it
/// timed out, maybe queued in a frozen server). KEYS: hash, the owner's
/// tombstone. ARGV: owner, tombstone ms, channel, wake message. Writes the
/// tombstone, so the acquire refuses if it runs later, and removes the
/// owner's reader or writer if it already ran. Returns 1 if one was removed.
pub(crate) static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
local gone = redis.call('HDEL', KEYS[1], 'r:' .. ARGV[1])
local w = redis.call('HGET', KEYS[1], 'w')
if w then
  local rest = string.match(w, '^%d+:(.*)$')
  if rest and string.find(rest, ARGV[1] .. ':', 1, true) == 1 then
    redis.call('HDEL', KEYS[1], 'w')
    gone = 1
  end
end
if gone == 1 then pcall(redis.call, 'PUBLISH', ARGV[3], ARGV[4]) end
return gone
",
    )
});

/// KEYS: hash, writer epoch. Changes nothing. Returns, as strings, {writer
/// epoch, now, field, value, field, value, ...} of the live fields.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {redis.call('GET', KEYS[2]) or '0', tostring(now)}
local h = redis.call('HGETALL', KEYS[1])
for i = 1, #h, 2 do
  local exp = tonumber(string.match(h[i + 1], '^(%d+)')) or 0
  if exp > now then
    out[#out + 1] = h[i]
    out[#out + 1] = h[i + 1]
  end
end
return out
",
    )
});
