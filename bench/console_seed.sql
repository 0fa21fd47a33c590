-- The console section's data (bench/console.go), set-based, in one transaction, as the
-- owner role. Its sizes are settings of the transaction: bench.orgs (orgs of 50 accounts
-- each) and bench.events (admissions in the billing log). Every id starts with "con-".
-- bench/console.go runs each step (from a "-- step: name" line to the next) in turn, timed.

-- step: accounts
-- An org con-NNNNN: 3 teams (-t1..-t3), 16 users (-u1..-u16, user u under team u % 3 + 1)
-- and 30 agents (-a1..-a30, agent a under user a % 16 + 1); the plans take turns. One org
-- in four has billing details (a legal name of two words from the lists below); every
-- org and every team has an API key (<account>-key).
insert into accounts (id, kind, parent, org, plan)
select 'con-' || lpad(o::text, 5, '0'), 'org', null, 'con-' || lpad(o::text, 5, '0'),
       (array['free', 'pro', 'enterprise'])[o % 3 + 1]
from generate_series(1, current_setting('bench.orgs')::int) o;

insert into accounts (id, kind, parent, org)
select org || '-t' || t, 'team', org, org
from (select 'con-' || lpad(o::text, 5, '0') as org from generate_series(1, current_setting('bench.orgs')::int) o) x,
     generate_series(1, 3) t;

insert into accounts (id, kind, parent, org)
select org || '-u' || u, 'user', org || '-t' || (u % 3 + 1), org
from (select 'con-' || lpad(o::text, 5, '0') as org from generate_series(1, current_setting('bench.orgs')::int) o) x,
     generate_series(1, 16) u;

insert into accounts (id, kind, parent, org)
select org || '-a' || a, 'agent', org || '-u' || (a % 16 + 1), org
from (select 'con-' || lpad(o::text, 5, '0') as org from generate_series(1, current_setting('bench.orgs')::int) o) x,
     generate_series(1, 30) a;

insert into api_keys (id, account, hash)
select id || '-key', id, sha256(convert_to(id || '-secret', 'UTF8'))
from accounts
where id like 'con-%' and kind in ('org', 'team');

insert into billing_details (org, legal_name, address, city, postal_code, country, email, currency, updated_by)
select 'con-' || lpad(o::text, 5, '0'),
       (array['Acme', 'Globex', 'Initech', 'Umbrella', 'Hooli', 'Stark', 'Wayne', 'Tyrell', 'Soylent', 'Cyberdyne'])[o % 10 + 1]
           || ' ' || (array['Analytics', 'Robotics', 'Widgets', 'Logistics', 'Media', 'Labs', 'Systems'])[o % 7 + 1]
           || ' ' || o || ' GmbH',
       array[o || ' Hauptstraße'], 'Berlin', '10115', 'DE', 'billing@con-' || o || '.example', 'EUR', 'bench'
from generate_series(4, current_setting('bench.orgs')::int, 4) o;

-- step: events
-- bench.events admissions spread evenly in time from the start of the previous month to
-- now (the transaction's), each by an agent (path org → team → user → agent) with its
-- org's API key: one in ten by an agent of the big org con-00001, the others by agents of
-- the other orgs in a hashed order; one in five with an idempotency key (idem-<n>). Ids
-- are <UUIDv7>.<shard>.<org> as admit makes them, so in time order as in a real log.
-- Times are in ms since the epoch: bench.t0 the start of the previous month, bench.m1 the
-- start of this one, bench.t1 now; admission i (its kafka_offset) is at
-- t0 + (t1 - t0) * i / (events + 1).
select set_config('bench.t0', (extract(epoch from date_trunc('month', now() at time zone 'UTC') - interval '1 month') * 1000)::bigint::text, true),
       set_config('bench.m1', (extract(epoch from date_trunc('month', now() at time zone 'UTC')) * 1000)::bigint::text, true),
       set_config('bench.t1', (extract(epoch from now()) * 1000)::bigint::text, true);

-- con_events(lo, hi, step) is admissions lo, lo + step, … up to hi: most of the seed's time
-- is here, hence integers where they do, and each agent's strings made once (agents) and
-- joined on keys computed from i alone, so that the join is hashed on both.
create function pg_temp.con_events(lo bigint, hi bigint, step bigint)
returns table (event_id text, billing_period date, event_time timestamptz, charged_period date, org text,
               account text, account_kind text, path text[], api_key_id text, idempotency_key text, plan text,
               source text, requests bigint, tokens bigint, cost_micros bigint, kafka_partition int,
               kafka_offset bigint)
language sql stable as $$
with agents as materialized (
    select o, a, org, org || '-a' || a as account, org || '-key' as key,
           array[org, org || '-t' || ((a % 16 + 1) % 3 + 1), org || '-u' || (a % 16 + 1), org || '-a' || a] as path
    from generate_series(1, current_setting('bench.orgs')::int) o, generate_series(1, 30) a,
         lateral (select 'con-' || lpad(o::text, 5, '0') as org) x
), ev as (
    select i, md5(i::text) as r, hashint8(i + 3)::int8 & 2047 as tokens,
           current_setting('bench.t0')::bigint
               + (current_setting('bench.t1')::bigint - current_setting('bench.t0')::bigint) * i
                 / (current_setting('bench.events')::bigint + 1) as ms,
           case when i % 10 = 3 then 1
                else 2 + (hashint8(i)::int8 & 2147483647) % (current_setting('bench.orgs')::int - 1) end as o,
           1 + (hashint8(i + 7)::int8 & 2147483647) % 30 as a
    from generate_series(lo, hi, step) i
), v7 as (
    select ev.*, lpad(to_hex(ms), 12, '0') as h,
           (date_trunc('month', now() at time zone 'UTC')
            - case when ms < current_setting('bench.m1')::bigint then interval '1 month' else interval '0' end)::date as bp
    from ev
)
select substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12)
           || '.' || (i % 16) || '.' || g.org,
       bp, to_timestamp(ms / 1000.0), bp, g.org, g.account, 'agent', g.path, g.key,
       case when i % 5 = 0 then 'idem-' || i end, 'pro', 'admit', 1, tokens, tokens * 3, (i % 12)::int, i
from v7 join agents g on g.o = v7.o and g.a = v7.a
$$;

-- A hash join on the agents keeps the admissions in their order (a merge join would sort
-- them); the indexes are built with room.
set local enable_mergejoin = off;
set local enable_nestloop = off;
set local jit = off;
set local maintenance_work_mem = '256MB';

-- Into the billing log by month, the way a bulk load is quick: the month's admissions (and
-- the rows the bench wrote there before) into a new table without indexes, then its
-- indexes built at once and the table attached as the month's partition
-- (usage_events_partition's name), in place of the old one. Readers and writers of the log
-- wait for the transaction (nothing else of the bench runs meanwhile). The bounds are
-- literals, so the planner knows the rows to come.
do $$
declare
    n bigint := current_setting('bench.events')::bigint;
    t0 bigint := current_setting('bench.t0')::bigint;
    m1 bigint := current_setting('bench.m1')::bigint;
    t1 bigint := current_setting('bench.t1')::bigint;
    -- The last admission of the previous month: the largest i with t0 + (t1 - t0) * i / (n + 1) < m1.
    k bigint := least(greatest(((m1 - t0) * (n + 1) - 1) / (t1 - t0), 0), n);
    month date := date_trunc('month', now() at time zone 'UTC') - interval '1 month';
    lo bigint := 1;
    hi bigint := k;
    cols text;
    seeded text;
    part text;
    stage text;
    rows bigint;
    total bigint := 0;
begin
    lock table usage_events in exclusive mode;
    select string_agg(quote_ident(attname), ', ' order by attnum) into cols
    from pg_attribute where attrelid = 'usage_events'::regclass and attnum > 0 and not attisdropped;
    select string_agg(quote_ident(name), ', ') into seeded
    from unnest(array['event_id', 'billing_period', 'event_time', 'charged_period', 'org', 'account', 'account_kind',
                      'path', 'api_key_id', 'idempotency_key', 'plan', 'source', 'requests', 'tokens', 'cost_micros',
                      'kafka_partition', 'kafka_offset']) name;
    for j in 1..2 loop
        part := 'usage_events_' || to_char(month, 'YYYY_MM');
        stage := 'con_stage_' || to_char(month, 'YYYY_MM');
        execute format('create table %I (like usage_events including defaults including constraints)', stage);
        execute format('insert into %I (%s) select * from pg_temp.con_events(%s, %s, 1)', stage, seeded, lo, hi);
        get diagnostics rows = row_count;
        total := total + rows;
        if exists (select 1 from pg_inherits i join pg_class c on c.oid = i.inhrelid
                   where i.inhparent = 'usage_events'::regclass and c.relname = part) then
            execute format('insert into %I (%s) select %s from %I', stage, cols, cols, part);
            execute format('alter table usage_events detach partition %I', part);
            execute format('drop table %I', part);
        end if;
        execute format('alter table %I rename to %I', stage, part);
        execute format('alter table %I add primary key (event_id, billing_period)', part);
        execute format('create index on %I using gin (path)', part);
        execute format('create index on %I using brin (event_time)', part);
        execute format('create index on %I (account, idempotency_key) where idempotency_key is not null', part);
        -- Attaching checks every row against the month's bounds (the rows of another
        -- month would fail it).
        execute format('alter table usage_events attach partition %I for values from (%L) to (%L)',
                       part, month, (month + interval '1 month')::date);
        month := month + interval '1 month';
        lo := k + 1;
        hi := n;
    end loop;
    if total <> n then
        raise exception 'seeded % admissions, not %', total, n;
    end if;
end
$$;

-- step: corrections
-- One admission in twenty with an outcome (one in ten of those a 5xx); one in a thousand
-- with a settle_tokens correction by the last of the reconcile runs, one every 12 hours
-- over the same span.
insert into usage_outcomes (event_id, status, requests, tokens, outcome_time, source, kafka_partition, kafka_offset)
select event_id, case when kafka_offset % 200 = 0 then 503 else 200 end, 1, tokens / 2,
       event_time + interval '2 seconds', 'admit', kafka_offset % 12, kafka_offset
from pg_temp.con_events(20, current_setting('bench.events')::bigint, 20);

insert into reconcile_runs (run_id, started_at, finished_at, summary)
select md5('run' || r)::uuid, now() - r * interval '12 hours', now() - r * interval '12 hours' + interval '4 seconds',
       jsonb_build_object('run_id', md5('run' || r)::uuid, 'dry_run', false,
                          'since', to_char(now() at time zone 'UTC' - interval '1 month', 'YYYY-MM'), 'recovered', 0,
                          'adjustments_planned', 0, 'adjustments_applied', 0, 'by_kind', '{}'::jsonb,
                          'drift_found', 0, 'events_skipped', 0, 'credits_planned', 0, 'credits_applied', 0,
                          'credits_restored', 0, 'plan_grants', 0, 'invariant_failures', '[]'::jsonb,
                          'problems', '[]'::jsonb)
from generate_series(0, 2 * extract(day from now() at time zone 'UTC')::int + 60) r;

insert into adjustments (run_id, kind, org, account, level, unit, period, amount, redis_before, redis_after, reason,
                         source_event, created_at, applied_at)
select md5('run0')::uuid, 'settle_tokens', org, org, 'org', 'tokens', billing_period, -(tokens - tokens / 2),
       1000000, 1000000 - (tokens - tokens / 2), 'outcome reported fewer tokens than admitted', event_id,
       event_time + interval '1 hour', event_time + interval '1 hour'
from pg_temp.con_events(1000, current_setting('bench.events')::bigint, 1000)
where tokens - tokens / 2 <> 0;

-- step: records
-- Events the meter could not decode, and a month of writes through the admin API.
insert into dead_letters (topic, partition, "offset", key, value, error, received_at)
select 'metergate.usage', d % 12, d, convert_to('con-' || d, 'UTF8'), convert_to('{"id":"broken-' || d || '"', 'UTF8'),
       'decode: unexpected end of JSON input', now() - d * interval '1 hour'
from generate_series(1, 300) d;

insert into audit_log (at, actor, role, method, route, path, status, before, after)
select now() - a * interval '10 minutes', 'admin-token', 'admin', 'PUT', '/v1/admin/accounts/{id}',
       '/v1/admin/accounts/con-' || lpad((a % current_setting('bench.orgs')::int + 1)::text, 5, '0'), 200,
       '{"plan":"free"}'::jsonb, '{"plan":"pro"}'::jsonb
from generate_series(1, 5000) a;

-- A webhook endpoint, disabled: its page has something to show and nothing is delivered.
insert into webhook_endpoints (id, url, event_types, enabled, disabled_reason)
values ('wh_' || md5('con-bench'), 'https://hooks.example/metergate', array['usage.threshold.v1'], false, 'bench: never delivered');

-- The events above reached the billing log by attaching partitions, past usage_daily's
-- triggers (migration 00028): the rollup the account chart reads is rebuilt from the log.
select usage_daily_rebuild();
