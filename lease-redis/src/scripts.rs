//! The Lua scripts: each operation is one script, so one round trip.
//!
//! The stored value is `<owner hex>:<token>:<holder label>`. Owner ids are fresh
//! random 128-bit values per lease, so comparing the owner prefix identifies the
//! exact lease; the label (which may contain `:`) is the rest of the value, for
//! people only. Values written before labels existed end after the token.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: lease, fence, cancel tombstone of this owner. ARGV: owner, ttl ms, holder label.
/// Returns {1, token, ''} when acquired, {0, pttl, holder value} when held,
/// {0, -3, ''} when this owner's acquire was cancelled (see [`CANCEL`]).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1], KEYS[3]) ~= 0 then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    return {0, -3, ''}
  end
  return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1]) or ''}
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token .. ':' .. ARGV[3], 'PX', ARGV[2])
return {1, token, ''}
",
    )
});

/// Every key of a set or none, in one script. KEYS: per key, its lease, fence
/// and cancel tombstone (as [`ACQUIRE`]), three by three. ARGV: ttl ms,
/// holder label, then each key's owner. Returns {1, token per key} when every
/// key was free, or {0, i, pttl} for the first held key (1-based; pttl -3
/// when this owner's acquire of it was cancelled), having written nothing.
pub(crate) static ACQUIRE_ALL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local n = #KEYS / 3
for i = 1, n do
  if redis.call('EXISTS', KEYS[3 * i - 2], KEYS[3 * i]) ~= 0 then
    if redis.call('EXISTS', KEYS[3 * i]) == 1 then
      return {0, i, -3}
    end
    return {0, i, redis.call('PTTL', KEYS[3 * i - 2])}
  end
end
local out = {1}
for i = 1, n do
  local token = redis.call('INCR', KEYS[3 * i - 1])
  redis.call('SET', KEYS[3 * i - 2], ARGV[2 + i] .. ':' .. token .. ':' .. ARGV[2], 'PX', ARGV[1])
  out[i + 1] = token
end
return out
",
    )
});

/// What extend and release compare the stored value with: the lease's owner
/// and token, `<owner hex>:<token>`. The value (`<owner>:<token>:<label>`, or
/// `<owner>:<token>` before labels) must start with it up to a `:` or equal
/// it, so a stale or forged lease with either part wrong touches nothing.
pub(crate) fn held_by(lease: &lease_api::Lease) -> String {
    let mut held = lease.owner().to_hex();
    held.push(':');
    held.push_str(&lease.token().get().to_string());
    held
}

/// KEYS: lease. ARGV: `<owner>:<token>` (see [`held_by`]), ttl ms. Returns 1
/// if extended.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
local p = ARGV[1]
if v and string.find(v, p, 1, true) == 1 and (#v == #p or string.byte(v, #p + 1) == 58) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
",
    )
});

/// Extend for many leases in one call. KEYS: the leases. ARGV: for each key,
/// `<owner>:<token>` (see [`held_by`]) and its ttl ms. Returns one 1 (extended)
/// or 0 (not held) per key, each compared as [`EXTEND`] does.
pub(crate) static EXTEND_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  local p = ARGV[2 * i - 1]
  if v and string.find(v, p, 1, true) == 1 and (#v == #p or string.byte(v, #p + 1) == 58) then
    redis.call('PEXPIRE', k, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
",
    )
});

/// The most leases one [`EXTEND_MANY`] call takes: a script runs alone on
/// the server, so a batch must stay short (about a millisecond).
pub(crate) const EXTEND_BATCH: usize = 1000;

/// KEYS: lease. ARGV: `<owner>:<token>` (see [`held_by`]), or the owner alone
/// to undo an acquire whose token is not known; channel (empty: no
/// announcement); key. Deletes and announces; 1 if released.
/// The announcement cannot fail the release (a user without channel
/// permissions): waiters then wake by the TTL fallback.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
local p = ARGV[1]
if v and string.find(v, p, 1, true) == 1 and (#v == #p or string.byte(v, #p + 1) == 58) then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then
    pcall(redis.call, 'PUBLISH', ARGV[2], ARGV[3])
  end
  return 1
end
return 0
",
    )
});

/// Cancels one owner's acquire whose outcome is unknown (it timed out, maybe
/// queued in a frozen server). KEYS: lease, cancel tombstone. ARGV: owner,
/// tombstone ms, channel, key. Writes the tombstone, so the acquire refuses if
/// it runs later, and deletes the lease if it already ran. Either order leaves
/// no lease behind. Returns 1 if a lease was deleted.
pub(crate) static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 33) == ARGV[1] .. ':' then
  redis.call('DEL', KEYS[1])
  if ARGV[3] ~= '' then
    pcall(redis.call, 'PUBLISH', ARGV[3], ARGV[4])
  end
  return 1
end
return 0
",
    )
});

/// KEYS: lease. Returns {value, pttl} or nil.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if not v then
  return nil
end
return {v, redis.call('PTTL', KEYS[1])}
",
    )
});

/// Redlock's second step. KEYS: lease, fence. ARGV: owner, token, holder label.
/// While `owner` holds the lease on this node, raise the fence counter to at
/// least `token` and record the token in the value. Returns 1 if done.
pub(crate) static RAISE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 33) == ARGV[1] .. ':' then
  local c = tonumber(redis.call('GET', KEYS[2]) or '0')
  if c < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2])
  end
  redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[3], 'KEEPTTL')
  return 1
end
return 0
",
    )
});
/// The server's clock in ms, inside a script (scripts replicate their
/// effects, so `TIME` is allowed).
const NOW_MS: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
";

/// Keeps the queue's keys (ordered tickets, deadlines, counter, marks) at
/// least `ARGV[2]` ms plus a minute: they go only when no ticket was
/// refreshed for that long. Should they go anyway (or the store lose them),
/// the counter starts again, but a ticket is its member `<seq>:<mark>`, and a
/// new join's mark is its own: a number given twice never names another
/// waiter's ticket.
const KEEP_QUEUE: &str = r"
local keep = tonumber(ARGV[2]) + 60000
for i = 1, 4 do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl >= 0 and pttl < keep then redis.call('PEXPIRE', KEYS[i], keep) end
  if pttl == -1 then redis.call('PEXPIRE', KEYS[i], keep) end
end
";

/// KEYS: the queue's tickets (member `<seq>:<mark>`, score: seq), deadlines
/// (same members, score: ms), counter, marks (hash: mark -> member).
/// ARGV: mark, ttl ms. Appends a ticket and returns its number; a join with
/// the mark of a live ticket (a retry after a lost answer) renews that ticket
/// and returns its number instead.
pub(crate) static QUEUE_JOIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW_MS}
local seq
local member = redis.call('HGET', KEYS[4], ARGV[1])
if member then
  local deadline = redis.call('ZSCORE', KEYS[2], member)
  local place = redis.call('ZSCORE', KEYS[1], member)
  if deadline and place and tonumber(deadline) > now then
    redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[2]), member)
    seq = tonumber(place)
  end
end
if not seq then
  seq = redis.call('INCR', KEYS[3])
  member = seq .. ':' .. ARGV[1]
  redis.call('ZADD', KEYS[1], seq, member)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), member)
  redis.call('HSET', KEYS[4], ARGV[1], member)
end
{KEEP_QUEUE}
return seq
"
    ))
});

/// Removes member `m` of marks hash `marks` if it names this member.
const FORGET_MARK: &str = r"
local function forget(marks, m)
  local mark = string.match(m, ':(.*)$')
  if mark and redis.call('HGET', marks, mark) == m then redis.call('HDEL', marks, mark) end
end
";

/// KEYS: tickets, deadlines, marks. ARGV: member. Drops the tickets past
/// their deadline; returns {-1, 0, ''} when this ticket is gone, {0, 0, ''}
/// when it is first, else {number ahead, its remaining ms, its member}.
pub(crate) static QUEUE_PLACE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW_MS}{FORGET_MARK}
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, m in ipairs(dead) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
  forget(KEYS[3], m)
end
local own = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not own or not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return {{-1, 0, ''}}
end
-- A ticket without a deadline (one of the two sets lost an entry, as an
-- eviction can do) counts as dead.
while true do
  local ahead = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. own, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #ahead == 0 then return {{0, 0, ''}} end
  local deadline = redis.call('ZSCORE', KEYS[2], ahead[1])
  if deadline then
    return {{tonumber(ahead[2]), math.max(tonumber(deadline) - now, 0), ahead[1]}}
  end
  redis.call('ZREM', KEYS[1], ahead[1])
  forget(KEYS[3], ahead[1])
end
"
    ))
});

/// KEYS: tickets, deadlines, counter, marks. ARGV: member, ttl ms. Returns 1
/// when the live ticket got `ttl` more from now, 0 when it was gone.
pub(crate) static QUEUE_REFRESH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW_MS}
local deadline = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not deadline or tonumber(deadline) <= now then return 0 end
redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[2]), ARGV[1])
{KEEP_QUEUE}
return 1
"
    ))
});

/// KEYS: tickets, deadlines, marks. ARGV: member, channel, message. Removes
/// the ticket and announces it on the channel (the waiter behind listens).
pub(crate) static QUEUE_LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{FORGET_MARK}
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
forget(KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"
    ))
});

/// KEYS: deadlines. ARGV: member. 1 while the ticket is queued and live.
pub(crate) static QUEUE_LIVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW_MS}
local deadline = redis.call('ZSCORE', KEYS[1], ARGV[1])
if deadline and tonumber(deadline) > now then return 1 end
return 0
"
    ))
});
