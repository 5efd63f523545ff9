-- checkpointers PostgreSQL schema, one migration per "-- migration N" block.
--
-- Migrations are APPENDED, never edited or removed: a block's number is its
-- schema version and databases created by older releases apply only the
-- blocks they lack. Every block runs in the migration transaction, under
-- pg_advisory_xact_lock, so several processes starting at once apply it
-- exactly once. "@schema" is replaced by the backend's (validated) schema
-- name. Statements are separated by a line holding only ";;".

-- migration 1: records, their tags, the partition registry (which is also
-- the per-partition write lock), the seq sequence, the write and drop
-- functions (one round trip, one transaction per batch).
CREATE TABLE @schema.partitions (
    pkey     text  COLLATE "C" PRIMARY KEY,
    user_key text  COLLATE "C" NOT NULL,
    name     bytea NOT NULL
)
;;
CREATE INDEX partitions_user ON @schema.partitions (user_key)
;;
CREATE TABLE @schema.records (
    pkey   text   COLLATE "C" NOT NULL,
    name   text   COLLATE "C" NOT NULL,
    seq    bigint NOT NULL,
    etag   text   NOT NULL,
    digest text   NOT NULL,
    tags   text   NOT NULL,
    value  bytea  NOT NULL,
    PRIMARY KEY (pkey, name)
)
;;
CREATE INDEX records_seq ON @schema.records (pkey, seq)
;;
CREATE TABLE @schema.tags (
    pkey text   COLLATE "C" NOT NULL,
    name text   COLLATE "C" NOT NULL,
    k    text   COLLATE "C" NOT NULL,
    v    text   COLLATE "C" NOT NULL,
    seq  bigint NOT NULL,
    PRIMARY KEY (pkey, name, k)
)
;;
CREATE INDEX tags_kv_name ON @schema.tags (pkey, k, v, name)
;;
CREATE INDEX tags_kv_seq ON @schema.tags (pkey, k, v, seq)
;;
CREATE SEQUENCE @schema.seq AS bigint
;;
-- One conditional batch. Every writer of a partition first locks its
-- partitions row (created here by the first put), so writers of one
-- partition queue and each sees the last one's commit; seqs come from one
-- sequence drawn under that lock, so they only grow within a partition (also
-- after a drop). Every condition is checked before anything is written; a
-- conflict returns one row (st = 1) and writes nothing. Otherwise one row
-- per put: st = 0 written (its new seq), st = 2 an append no-op (the stored
-- record). Arrays: n/m/im/et/dg/cd/tg/vl/tc per put (name, mode u/c/a/i,
-- if_match, etag, digest, content digest, tags JSON, value, tag count), tk/tv
-- the tag rows of all puts in order, dn/di per delete (name, if_match).
CREATE FUNCTION @schema.write_batch(
    p_pkey text, p_user_key text, p_name bytea,
    n text[], m text[], im text[], et text[], dg text[], cd text[], tg text[], vl bytea[], tc int[],
    tk text[], tv text[], dn text[], di text[]
) RETURNS TABLE (st int, i int, name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    np int := coalesce(array_length(n, 1), 0);
    nd int := coalesce(array_length(dn, 1), 0);
    hit boolean[] := array_fill(false, ARRAY[np + 1]);
    cur_etag text;
    cur_digest text;
    s bigint;
    off int := 0;
BEGIN
    LOOP
        PERFORM 1 FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;
        EXIT WHEN FOUND OR np = 0;
        INSERT INTO @schema.partitions AS p (pkey, user_key, name) VALUES (p_pkey, p_user_key, p_name)
            ON CONFLICT (pkey) DO NOTHING;
    END LOOP;
    FOR x IN 1..np LOOP
        SELECT r.etag, r.digest INTO cur_etag, cur_digest
            FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        hit[x] := FOUND;
        IF (m[x] = 'c' AND hit[x])
           OR (m[x] = 'i' AND (NOT hit[x] OR cur_etag IS DISTINCT FROM im[x]))
           OR (m[x] = 'a' AND hit[x] AND split_part(cur_digest, '.', 1) <> cd[x]) THEN
            RETURN QUERY SELECT 1, x - 1, n[x], r.seq, r.etag, r.digest, r.tags, r.value
                FROM (SELECT 1) AS one
                LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = n[x];
            RETURN;
        END IF;
    END LOOP;
    FOR x IN 1..nd LOOP
        CONTINUE WHEN di[x] IS NULL;
        SELECT r.etag INTO cur_etag FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = dn[x];
        IF NOT FOUND OR cur_etag IS DISTINCT FROM di[x] THEN
            RETURN QUERY SELECT 1, np + x - 1, dn[x], r.seq, r.etag, r.digest, r.tags, r.value
                FROM (SELECT 1) AS one
                LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = dn[x];
            RETURN;
        END IF;
    END LOOP;
    FOR x IN 1..np LOOP
        IF m[x] = 'a' AND hit[x] THEN
            RETURN QUERY SELECT 2, x - 1, r.name, r.seq, r.etag, r.digest, r.tags, r.value
                FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        ELSE
            s := nextval('@schema.seq');
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], s, et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO UPDATE SET seq = EXCLUDED.seq, etag = EXCLUDED.etag,
                    digest = EXCLUDED.digest, tags = EXCLUDED.tags, value = EXCLUDED.value;
            IF hit[x] THEN
                DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = n[x];
            END IF;
            IF tc[x] > 0 THEN
                INSERT INTO @schema.tags (pkey, name, k, v, seq)
                    SELECT p_pkey, n[x], tk[j], tv[j], s FROM generate_series(off + 1, off + tc[x]) AS j;
            END IF;
            RETURN QUERY SELECT 0, x - 1, NULL::text, s, NULL::text, NULL::text, NULL::text, NULL::bytea;
        END IF;
        off := off + tc[x];
    END LOOP;
    IF nd > 0 THEN
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = ANY (dn);
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (dn);
        IF NOT EXISTS (SELECT 1 FROM @schema.records AS r WHERE r.pkey = p_pkey) THEN
            DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        END IF;
    END IF;
END
$fn$
;;
-- Delete a whole partition under its lock; returns how many records went.
CREATE FUNCTION @schema.drop_partition(p_pkey text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    c bigint;
BEGIN
    PERFORM 1 FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;
    DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey;
    DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey;
    GET DIAGNOSTICS c = ROW_COUNT;
    DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
    RETURN c;
END
$fn$

;;
-- migration 2: retention. A partition's expiry (seconds since the epoch on
-- the writer's clock; NULL: never), set by write_batch under the partition's
-- lock (a write to an expired partition first deletes what it held); an index
-- for the sweep. Existing rows keep NULL: nothing of theirs expires.
ALTER TABLE @schema.partitions ADD COLUMN expires_at double precision
;;
CREATE INDEX partitions_expiry ON @schema.partitions (expires_at) WHERE expires_at IS NOT NULL
;;
DROP FUNCTION @schema.write_batch(
    text, text, bytea, text[], text[], text[], text[], text[], text[], text[], bytea[], int[], text[], text[], text[],
    text[]
)
;;
CREATE FUNCTION @schema.write_batch(
    p_pkey text, p_user_key text, p_name bytea, p_now double precision, p_deadline double precision,
    n text[], m text[], im text[], et text[], dg text[], cd text[], tg text[], vl bytea[], tc int[],
    tk text[], tv text[], dn text[], di text[]
) RETURNS TABLE (st int, i int, name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    np int := coalesce(array_length(n, 1), 0);
    nd int := coalesce(array_length(dn, 1), 0);
    hit boolean[] := array_fill(false, ARRAY[np + 1]);
    cur_etag text;
    cur_digest text;
    s bigint;
    off int := 0;
    cur_exp double precision;
    held boolean := false;
BEGIN
    LOOP
        SELECT p.expires_at INTO cur_exp FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;
        held := FOUND;
        EXIT WHEN FOUND OR np = 0;
        INSERT INTO @schema.partitions AS p (pkey, user_key, name, expires_at)
            VALUES (p_pkey, p_user_key, p_name, p_deadline)
            ON CONFLICT (pkey) DO NOTHING;
    END LOOP;
    IF cur_exp <= p_now THEN  -- expired, not yet swept: old data never comes back
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey;
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        SELECT r.etag, r.digest INTO cur_etag, cur_digest
            FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        hit[x] := FOUND;
        IF (m[x] = 'c' AND hit[x])
           OR (m[x] = 'i' AND (NOT hit[x] OR cur_etag IS DISTINCT FROM im[x]))
           OR (m[x] = 'a' AND hit[x] AND split_part(cur_digest, '.', 1) <> cd[x]) THEN
            RETURN QUERY SELECT 1, x - 1, n[x], r.seq, r.etag, r.digest, r.tags, r.value
                FROM (SELECT 1) AS one
                LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = n[x];
            RETURN;
        END IF;
    END LOOP;
    FOR x IN 1..nd LOOP
        CONTINUE WHEN di[x] IS NULL;
        SELECT r.etag INTO cur_etag FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = dn[x];
        IF NOT FOUND OR cur_etag IS DISTINCT FROM di[x] THEN
            RETURN QUERY SELECT 1, np + x - 1, dn[x], r.seq, r.etag, r.digest, r.tags, r.value
                FROM (SELECT 1) AS one
                LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = dn[x];
            RETURN;
        END IF;
    END LOOP;
    -- the batch passed its checks: it sets the expiry (a refused one changes nothing)
    IF held AND cur_exp IS DISTINCT FROM p_deadline THEN
        UPDATE @schema.partitions AS p SET expires_at = p_deadline WHERE p.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF m[x] = 'a' AND hit[x] THEN
            RETURN QUERY SELECT 2, x - 1, r.name, r.seq, r.etag, r.digest, r.tags, r.value
                FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        ELSE
            s := nextval('@schema.seq');
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], s, et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO UPDATE SET seq = EXCLUDED.seq, etag = EXCLUDED.etag,
                    digest = EXCLUDED.digest, tags = EXCLUDED.tags, value = EXCLUDED.value;
            IF hit[x] THEN
                DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = n[x];
            END IF;
            IF tc[x] > 0 THEN
                INSERT INTO @schema.tags (pkey, name, k, v, seq)
                    SELECT p_pkey, n[x], tk[j], tv[j], s FROM generate_series(off + 1, off + tc[x]) AS j;
            END IF;
            RETURN QUERY SELECT 0, x - 1, NULL::text, s, NULL::text, NULL::text, NULL::text, NULL::bytea;
        END IF;
        off := off + tc[x];
    END LOOP;
    IF nd > 0 THEN
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = ANY (dn);
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (dn);
        IF NOT EXISTS (SELECT 1 FROM @schema.records AS r WHERE r.pkey = p_pkey) THEN
            DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        END IF;
    END IF;
END
$fn$
;;
-- migration 3: write_batch, same arguments and results, cheaper. An IF_MATCH
-- put of the stored record itself (its etag is its if_match, same digest:
-- the layer above re-puts a lease record that way to carry a condition) is
-- checked, not rewritten: st = 2 with the stored record, as an append no-op
-- (no new row version, index entries or dead tuple per guarded write). The
-- tags of a replaced record are deleted only when it had some, and result
-- rows are returned with RETURN NEXT (no query each): the stored record of a
-- no-op comes from the check's own read.
CREATE OR REPLACE FUNCTION @schema.write_batch(
    p_pkey text, p_user_key text, p_name bytea, p_now double precision, p_deadline double precision,
    n text[], m text[], im text[], et text[], dg text[], cd text[], tg text[], vl bytea[], tc int[],
    tk text[], tv text[], dn text[], di text[]
) RETURNS TABLE (st int, i int, name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    np int := coalesce(array_length(n, 1), 0);
    nd int := coalesce(array_length(dn, 1), 0);
    hit boolean[] := array_fill(false, ARRAY[np + 1]);
    keep boolean[] := array_fill(false, ARRAY[np + 1]);
    tagged boolean[] := array_fill(false, ARRAY[np + 1]);
    kseq bigint[] := array_fill(NULL::bigint, ARRAY[np + 1]);
    ketag text[] := array_fill(NULL::text, ARRAY[np + 1]);
    kdigest text[] := array_fill(NULL::text, ARRAY[np + 1]);
    ktags text[] := array_fill(NULL::text, ARRAY[np + 1]);
    kval bytea[] := array_fill(NULL::bytea, ARRAY[np + 1]);
    cur_etag text;
    cur_digest text;
    cur_tags text;
    cur_seq bigint;
    cur_value bytea;
    s bigint;
    off int := 0;
    cur_exp double precision;
    held boolean := false;
BEGIN
    LOOP
        SELECT p.expires_at INTO cur_exp FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;
        held := FOUND;
        EXIT WHEN FOUND OR np = 0;
        INSERT INTO @schema.partitions AS p (pkey, user_key, name, expires_at)
            VALUES (p_pkey, p_user_key, p_name, p_deadline)
            ON CONFLICT (pkey) DO NOTHING;
    END LOOP;
    IF cur_exp <= p_now THEN  -- expired, not yet swept: old data never comes back
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey;
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        SELECT r.etag, r.digest, r.tags, r.seq, r.value INTO cur_etag, cur_digest, cur_tags, cur_seq, cur_value
            FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        hit[x] := FOUND;
        IF (m[x] = 'c' AND hit[x])
           OR (m[x] = 'i' AND (NOT hit[x] OR cur_etag IS DISTINCT FROM im[x]))
           OR (m[x] = 'a' AND hit[x] AND split_part(cur_digest, '.', 1) <> cd[x]) THEN
            RETURN QUERY SELECT 1, x - 1, n[x], r.seq, r.etag, r.digest, r.tags, r.value
                FROM (SELECT 1) AS one
                LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = n[x];
            RETURN;
        END IF;
        keep[x] := hit[x] AND (m[x] = 'a' OR (m[x] = 'i' AND et[x] = im[x] AND cur_digest = dg[x]));
        tagged[x] := hit[x] AND cur_tags <> '{}';
        IF keep[x] THEN  -- its row as read under the lock: what the batch returns for it
            kseq[x] := cur_seq;
            ketag[x] := cur_etag;
            kdigest[x] := cur_digest;
            ktags[x] := cur_tags;
            kval[x] := cur_value;
        END IF;
    END LOOP;
    FOR x IN 1..nd LOOP
        CONTINUE WHEN di[x] IS NULL;
        SELECT r.etag INTO cur_etag FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = dn[x];
        IF NOT FOUND OR cur_etag IS DISTINCT FROM di[x] THEN
            RETURN QUERY SELECT 1, np + x - 1, dn[x], r.seq, r.etag, r.digest, r.tags, r.value
                FROM (SELECT 1) AS one
                LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = dn[x];
            RETURN;
        END IF;
    END LOOP;
    -- the batch passed its checks: it sets the expiry (a refused one changes nothing)
    IF held AND cur_exp IS DISTINCT FROM p_deadline THEN
        UPDATE @schema.partitions AS p SET expires_at = p_deadline WHERE p.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF NOT keep[x] THEN
            s := nextval('@schema.seq');
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], s, et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO UPDATE SET seq = EXCLUDED.seq, etag = EXCLUDED.etag,
                    digest = EXCLUDED.digest, tags = EXCLUDED.tags, value = EXCLUDED.value;
            IF tagged[x] THEN
                DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = n[x];
            END IF;
            IF tc[x] > 0 THEN
                INSERT INTO @schema.tags (pkey, name, k, v, seq)
                    SELECT p_pkey, n[x], tk[j], tv[j], s FROM generate_series(off + 1, off + tc[x]) AS j;
            END IF;
            st := 0; i := x - 1; name := NULL; seq := s; etag := NULL; digest := NULL; tags := NULL; value := NULL;
        ELSE  -- kept: the stored record, as read under the lock
            st := 2; i := x - 1; name := n[x]; seq := kseq[x]; etag := ketag[x]; digest := kdigest[x];
            tags := ktags[x]; value := kval[x];
        END IF;
        RETURN NEXT;
        off := off + tc[x];
    END LOOP;
    IF nd > 0 THEN
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = ANY (dn);
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (dn);
        IF NOT EXISTS (SELECT 1 FROM @schema.records AS r WHERE r.pkey = p_pkey) THEN
            DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        END IF;
    END IF;
END
$fn$
;;
-- migration 4: write_batch, same arguments and results, fewer statements. An
-- APPEND or CREATE put is one INSERT ... ON CONFLICT DO NOTHING (its seq drawn
-- in it), made where migration 3 read the row to check it: a row inserted
-- means no record was there; only when one was does the put read it (an
-- append of the same content: kept, st = 2, the stored record; else a
-- conflict). Nothing stays written when a batch meets a conflict: the rows
-- its checks inserted are deleted again before the conflict row is returned
-- (under the partition's lock, in one transaction: no reader or writer ever
-- sees them). Other puts are checked as before; a seq the INSERT drew for a
-- kept or refused put is skipped (seqs still only grow within a partition;
-- a batch's puts draw theirs in put order, as before).
CREATE OR REPLACE FUNCTION @schema.write_batch(
    p_pkey text, p_user_key text, p_name bytea, p_now double precision, p_deadline double precision,
    n text[], m text[], im text[], et text[], dg text[], cd text[], tg text[], vl bytea[], tc int[],
    tk text[], tv text[], dn text[], di text[]
) RETURNS TABLE (st int, i int, name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    np int := coalesce(array_length(n, 1), 0);
    nd int := coalesce(array_length(dn, 1), 0);
    hit boolean[] := array_fill(false, ARRAY[np + 1]);
    keep boolean[] := array_fill(false, ARRAY[np + 1]);
    done boolean[] := array_fill(false, ARRAY[np + 1]);
    tagged boolean[] := array_fill(false, ARRAY[np + 1]);
    kseq bigint[] := array_fill(NULL::bigint, ARRAY[np + 1]);
    ketag text[] := array_fill(NULL::text, ARRAY[np + 1]);
    kdigest text[] := array_fill(NULL::text, ARRAY[np + 1]);
    ktags text[] := array_fill(NULL::text, ARRAY[np + 1]);
    kval bytea[] := array_fill(NULL::bytea, ARRAY[np + 1]);
    added text[] := ARRAY[]::text[];
    bad int := 0;
    cur_etag text;
    cur_digest text;
    cur_tags text;
    cur_seq bigint;
    cur_value bytea;
    s bigint;
    off int := 0;
    cur_exp double precision;
    held boolean := false;
BEGIN
    LOOP
        SELECT p.expires_at INTO cur_exp FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;
        held := FOUND;
        EXIT WHEN FOUND OR np = 0;
        INSERT INTO @schema.partitions AS p (pkey, user_key, name, expires_at)
            VALUES (p_pkey, p_user_key, p_name, p_deadline)
            ON CONFLICT (pkey) DO NOTHING;
    END LOOP;
    IF cur_exp <= p_now THEN  -- expired, not yet swept: old data never comes back
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey;
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF m[x] IN ('a', 'c') THEN  -- inserted now (seq included) unless a record is there
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], nextval('@schema.seq'), et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO NOTHING
                RETURNING r.seq INTO s;
            IF FOUND THEN
                added := added || n[x];
                done[x] := true;
                kseq[x] := s;
                CONTINUE;
            END IF;
        END IF;
        SELECT r.etag, r.digest, r.tags, r.seq, r.value INTO cur_etag, cur_digest, cur_tags, cur_seq, cur_value
            FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        hit[x] := FOUND;
        IF (m[x] = 'c' AND hit[x])
           OR (m[x] = 'i' AND (NOT hit[x] OR cur_etag IS DISTINCT FROM im[x]))
           OR (m[x] = 'a' AND hit[x] AND split_part(cur_digest, '.', 1) <> cd[x]) THEN
            bad := x;
            EXIT;
        END IF;
        keep[x] := hit[x] AND (m[x] = 'a' OR (m[x] = 'i' AND et[x] = im[x] AND cur_digest = dg[x]));
        tagged[x] := hit[x] AND cur_tags <> '{}';
        IF keep[x] THEN  -- its row as read under the lock: what the batch returns for it
            kseq[x] := cur_seq;
            ketag[x] := cur_etag;
            kdigest[x] := cur_digest;
            ktags[x] := cur_tags;
            kval[x] := cur_value;
        ELSE  -- drawn in put order, as the inserts' own
            kseq[x] := nextval('@schema.seq');
        END IF;
    END LOOP;
    IF bad = 0 THEN
        FOR x IN 1..nd LOOP
            CONTINUE WHEN di[x] IS NULL;
            SELECT r.etag INTO cur_etag FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = dn[x];
            IF NOT FOUND OR cur_etag IS DISTINCT FROM di[x] THEN
                bad := np + x;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF bad > 0 THEN  -- refused: what the checks inserted goes, then the conflict row
        IF cardinality(added) > 0 THEN
            DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (added);
        END IF;
        RETURN QUERY SELECT 1, bad - 1, q.nm, r.seq, r.etag, r.digest, r.tags, r.value
            FROM (SELECT CASE WHEN bad <= np THEN n[bad] ELSE dn[bad - np] END AS nm) AS q
            LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = q.nm;
        RETURN;
    END IF;
    -- the batch passed its checks: it sets the expiry (a refused one changes nothing)
    IF held AND cur_exp IS DISTINCT FROM p_deadline THEN
        UPDATE @schema.partitions AS p SET expires_at = p_deadline WHERE p.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF keep[x] THEN  -- kept: the stored record, as read under the lock
            st := 2; i := x - 1; name := n[x]; seq := kseq[x]; etag := ketag[x]; digest := kdigest[x];
            tags := ktags[x]; value := kval[x];
        ELSE
            IF NOT done[x] THEN  -- not inserted by the checks: written now
                INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                    VALUES (p_pkey, n[x], kseq[x], et[x], dg[x], tg[x], vl[x])
                    ON CONFLICT ON CONSTRAINT records_pkey DO UPDATE SET seq = EXCLUDED.seq, etag = EXCLUDED.etag,
                        digest = EXCLUDED.digest, tags = EXCLUDED.tags, value = EXCLUDED.value;
                IF tagged[x] THEN
                    DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = n[x];
                END IF;
            END IF;
            IF tc[x] > 0 THEN
                INSERT INTO @schema.tags (pkey, name, k, v, seq)
                    SELECT p_pkey, n[x], tk[j], tv[j], kseq[x] FROM generate_series(off + 1, off + tc[x]) AS j;
            END IF;
            st := 0; i := x - 1; name := NULL; seq := kseq[x]; etag := NULL; digest := NULL; tags := NULL;
            value := NULL;
        END IF;
        RETURN NEXT;
        off := off + tc[x];
    END LOOP;
    IF nd > 0 THEN
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = ANY (dn);
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (dn);
        IF NOT EXISTS (SELECT 1 FROM @schema.records AS r WHERE r.pkey = p_pkey) THEN
            DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        END IF;
    END IF;
END
$fn$
;;
-- migration 5: the partition lock is a transaction-scoped advisory lock
-- (pg_advisory_xact_lock on a hash of the schema and the partition key)
-- instead of a FOR UPDATE lock on the partitions row. A row lock writes WAL
-- and gives the transaction an id, so a batch that writes nothing (a lease
-- guard kept, an append of the same content: every put st = 2) committed
-- with a WAL flush; now it writes no WAL at all, and the partitions row is
-- not touched by every write. Writers of one partition still queue, on the
-- advisory lock, and each statement after it sees the previous writer's
-- commit. The row is still locked (FOR UPDATE, after the advisory lock):
-- * for a partition that can expire (expires_at set), so that the sweep
--   (FOR UPDATE SKIP LOCKED) skips a partition being written, also when a
--   previous release sweeps;
-- * by every writer until row_lock_until (an hour after this migration, when
--   an earlier one was committed before it): a batch that began under
--   version 4 (row lock only) may still be running when this commits, and
--   writers of its partition wait for it. A schema created at version 5 in
--   one go has no such hour.
-- Otherwise write_batch is migration 4's: same arguments and results (CREATE
-- OR REPLACE), so a running previous release keeps working. drop_partition
-- takes the advisory lock, then the row lock.
CREATE TABLE @schema.row_lock_until (until timestamptz NOT NULL)
;;
INSERT INTO @schema.row_lock_until (until)  -- migrations committed before this one: writers may be running
    SELECT CASE WHEN EXISTS (SELECT 1 FROM @schema.schema_migrations AS m WHERE m.at < now())
                THEN now() + interval '1 hour' ELSE '-infinity'::timestamptz END
;;
CREATE OR REPLACE FUNCTION @schema.write_batch(
    p_pkey text, p_user_key text, p_name bytea, p_now double precision, p_deadline double precision,
    n text[], m text[], im text[], et text[], dg text[], cd text[], tg text[], vl bytea[], tc int[],
    tk text[], tv text[], dn text[], di text[]
) RETURNS TABLE (st int, i int, name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    np int := coalesce(array_length(n, 1), 0);
    nd int := coalesce(array_length(dn, 1), 0);
    hit boolean[] := array_fill(false, ARRAY[np + 1]);
    keep boolean[] := array_fill(false, ARRAY[np + 1]);
    done boolean[] := array_fill(false, ARRAY[np + 1]);
    tagged boolean[] := array_fill(false, ARRAY[np + 1]);
    kseq bigint[] := array_fill(NULL::bigint, ARRAY[np + 1]);
    ketag text[] := array_fill(NULL::text, ARRAY[np + 1]);
    kdigest text[] := array_fill(NULL::text, ARRAY[np + 1]);
    ktags text[] := array_fill(NULL::text, ARRAY[np + 1]);
    kval bytea[] := array_fill(NULL::bytea, ARRAY[np + 1]);
    added text[] := ARRAY[]::text[];
    bad int := 0;
    cur_etag text;
    cur_digest text;
    cur_tags text;
    cur_seq bigint;
    cur_value bytea;
    s bigint;
    off int := 0;
    cur_exp double precision;
    row_locks timestamptz;
    held boolean := false;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('@schema.' || p_pkey, 0));
    LOOP
        SELECT p.expires_at, (SELECT u.until FROM @schema.row_lock_until AS u) INTO cur_exp, row_locks
            FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        held := FOUND;
        IF held AND (cur_exp IS NOT NULL OR clock_timestamp() < row_locks) THEN  -- its row is locked too (above)
            SELECT p.expires_at INTO cur_exp FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;
            held := FOUND;  -- a sweep that held the row first deleted it: a new partition
        END IF;
        EXIT WHEN held OR np = 0;
        INSERT INTO @schema.partitions AS p (pkey, user_key, name, expires_at)
            VALUES (p_pkey, p_user_key, p_name, p_deadline)
            ON CONFLICT (pkey) DO NOTHING;
    END LOOP;
    IF cur_exp <= p_now THEN  -- expired, not yet swept: old data never comes back
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey;
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF m[x] IN ('a', 'c') THEN  -- inserted now (seq included) unless a record is there
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], nextval('@schema.seq'), et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO NOTHING
                RETURNING r.seq INTO s;
            IF FOUND THEN
                added := added || n[x];
                done[x] := true;
                kseq[x] := s;
                CONTINUE;
            END IF;
        END IF;
        SELECT r.etag, r.digest, r.tags, r.seq, r.value INTO cur_etag, cur_digest, cur_tags, cur_seq, cur_value
            FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        hit[x] := FOUND;
        IF (m[x] = 'c' AND hit[x])
           OR (m[x] = 'i' AND (NOT hit[x] OR cur_etag IS DISTINCT FROM im[x]))
           OR (m[x] = 'a' AND hit[x] AND split_part(cur_digest, '.', 1) <> cd[x]) THEN
            bad := x;
            EXIT;
        END IF;
        keep[x] := hit[x] AND (m[x] = 'a' OR (m[x] = 'i' AND et[x] = im[x] AND cur_digest = dg[x]));
        tagged[x] := hit[x] AND cur_tags <> '{}';
        IF keep[x] THEN  -- its row as read under the lock: what the batch returns for it
            kseq[x] := cur_seq;
            ketag[x] := cur_etag;
            kdigest[x] := cur_digest;
            ktags[x] := cur_tags;
            kval[x] := cur_value;
        ELSE  -- drawn in put order, as the inserts' own
            kseq[x] := nextval('@schema.seq');
        END IF;
    END LOOP;
    IF bad = 0 THEN
        FOR x IN 1..nd LOOP
            CONTINUE WHEN di[x] IS NULL;
            SELECT r.etag INTO cur_etag FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = dn[x];
            IF NOT FOUND OR cur_etag IS DISTINCT FROM di[x] THEN
                bad := np + x;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF bad > 0 THEN  -- refused: what the checks inserted goes, then the conflict row
        IF cardinality(added) > 0 THEN
            DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (added);
        END IF;
        RETURN QUERY SELECT 1, bad - 1, q.nm, r.seq, r.etag, r.digest, r.tags, r.value
            FROM (SELECT CASE WHEN bad <= np THEN n[bad] ELSE dn[bad - np] END AS nm) AS q
            LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = q.nm;
        RETURN;
    END IF;
    -- the batch passed its checks: it sets the expiry (a refused one changes nothing)
    IF held AND cur_exp IS DISTINCT FROM p_deadline THEN
        UPDATE @schema.partitions AS p SET expires_at = p_deadline WHERE p.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF keep[x] THEN  -- kept: the stored record, as read under the lock
            st := 2; i := x - 1; name := n[x]; seq := kseq[x]; etag := ketag[x]; digest := kdigest[x];
            tags := ktags[x]; value := kval[x];
        ELSE
            IF NOT done[x] THEN  -- not inserted by the checks: written now
                INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                    VALUES (p_pkey, n[x], kseq[x], et[x], dg[x], tg[x], vl[x])
                    ON CONFLICT ON CONSTRAINT records_pkey DO UPDATE SET seq = EXCLUDED.seq, etag = EXCLUDED.etag,
                        digest = EXCLUDED.digest, tags = EXCLUDED.tags, value = EXCLUDED.value;
                IF tagged[x] THEN
                    DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = n[x];
                END IF;
            END IF;
            IF tc[x] > 0 THEN
                INSERT INTO @schema.tags (pkey, name, k, v, seq)
                    SELECT p_pkey, n[x], tk[j], tv[j], kseq[x] FROM generate_series(off + 1, off + tc[x]) AS j;
            END IF;
            st := 0; i := x - 1; name := NULL; seq := kseq[x]; etag := NULL; digest := NULL; tags := NULL;
            value := NULL;
        END IF;
        RETURN NEXT;
        off := off + tc[x];
    END LOOP;
    IF nd > 0 THEN
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = ANY (dn);
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (dn);
        IF NOT EXISTS (SELECT 1 FROM @schema.records AS r WHERE r.pkey = p_pkey) THEN
            DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        END IF;
    END IF;
END
$fn$

;;
CREATE OR REPLACE FUNCTION @schema.drop_partition(p_pkey text) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    c bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('@schema.' || p_pkey, 0));
    PERFORM 1 FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;  -- a writer of any release is done
    DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey;
    DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey;
    GET DIAGNOSTICS c = ROW_COUNT;
    DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
    RETURN c;
END
$fn$

;;
-- migration 6: limited reads whose plan cannot read a whole partition,
-- whatever the planner believes of its size. A table never analyzed, a
-- thread grown since the last ANALYZE, a generic plan: the planner believes
-- the partition holds a few rows, and then a scan of all of them (and a sort)
-- looks as cheap as a walk of the index that stops at the limit.
-- * records_seq is on (pkey || '', seq): only reads in seq order, which name
--   the partition by that expression, can use it. On (pkey, seq) it also
--   served "pkey = $1" and was taken for lookups by name and for the
--   children of a pick, reading the whole partition.
-- * pick_records and pick_tagged: the records of a limited read (in name or
--   seq order, down or up, names in [p_lo, p_hi), seqs in [p_first,
--   p_last], p_slashes '/' in the name unless NULL; values empty unless
--   p_values), walked along the one index that is in that order, stopped at
--   the limit; pick_tagged reads each record by its key. Their SET makes every plan that
--   sorts cost more than any plan that does not, so the planner cannot trade
--   the walk for a scan and a sort. pick_tagged bounds the whole key of its
--   index, (pkey, k, v, name or seq), as one row and orders by it, so no
--   other index of tags (the primary key is also in name order within a
--   partition) gives that order. STABLE: they read in the caller's snapshot.
-- Building records_seq again blocks writes to records while it runs (one
-- pass over the table).
DROP INDEX @schema.records_seq
;;
CREATE INDEX records_seq ON @schema.records ((pkey || ''), seq)
;;
CREATE FUNCTION @schema.pick_records(
    p_pkey text, p_lo text, p_hi text, p_slashes int, p_by_seq boolean, p_first bigint, p_last bigint, p_limit bigint, p_desc boolean, p_values boolean
) RETURNS TABLE (name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql STABLE ROWS 10
SET enable_sort = off SET enable_incremental_sort = off
AS $fn$
#variable_conflict use_column
BEGIN
    IF p_by_seq AND p_desc THEN
        RETURN QUERY SELECT r.name, r.seq, r.etag, r.digest, r.tags, CASE WHEN p_values THEN r.value ELSE ''::bytea END
            FROM @schema.records AS r
            WHERE (r.pkey || '') = p_pkey AND r.seq >= p_first AND r.seq <= p_last
                AND r.name >= p_lo AND r.name < p_hi AND (p_slashes IS NULL OR length(r.name) - length(replace(r.name, '/', '')) = p_slashes)
            ORDER BY r.seq DESC LIMIT p_limit;
    ELSIF p_by_seq THEN
        RETURN QUERY SELECT r.name, r.seq, r.etag, r.digest, r.tags, CASE WHEN p_values THEN r.value ELSE ''::bytea END
            FROM @schema.records AS r
            WHERE (r.pkey || '') = p_pkey AND r.seq >= p_first AND r.seq <= p_last
                AND r.name >= p_lo AND r.name < p_hi AND (p_slashes IS NULL OR length(r.name) - length(replace(r.name, '/', '')) = p_slashes)
            ORDER BY r.seq LIMIT p_limit;
    ELSIF p_desc THEN
        RETURN QUERY SELECT r.name, r.seq, r.etag, r.digest, r.tags, CASE WHEN p_values THEN r.value ELSE ''::bytea END
            FROM @schema.records AS r
            WHERE r.pkey = p_pkey AND r.name >= p_lo AND r.name < p_hi AND (p_slashes IS NULL OR length(r.name) - length(replace(r.name, '/', '')) = p_slashes)
            ORDER BY r.name DESC LIMIT p_limit;
    ELSE
        RETURN QUERY SELECT r.name, r.seq, r.etag, r.digest, r.tags, CASE WHEN p_values THEN r.value ELSE ''::bytea END
            FROM @schema.records AS r
            WHERE r.pkey = p_pkey AND r.name >= p_lo AND r.name < p_hi AND (p_slashes IS NULL OR length(r.name) - length(replace(r.name, '/', '')) = p_slashes)
            ORDER BY r.name LIMIT p_limit;
    END IF;
END
$fn$
;;
CREATE FUNCTION @schema.pick_tagged(
    p_pkey text, p_k text, p_v text, p_lo text, p_hi text, p_slashes int, p_by_seq boolean, p_first bigint, p_last bigint, p_limit bigint, p_desc boolean, p_values boolean
) RETURNS TABLE (name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql STABLE ROWS 10
SET enable_sort = off SET enable_incremental_sort = off
AS $fn$
#variable_conflict use_column
BEGIN
    IF p_by_seq AND p_desc THEN
        RETURN QUERY SELECT r.* FROM @schema.tags AS t CROSS JOIN LATERAL (
                SELECT r.name, r.seq, r.etag, r.digest, r.tags, CASE WHEN p_values THEN r.value ELSE ''::bytea END
                FROM @schema.records AS r WHERE r.pkey = t.pkey AND r.name = t.name OFFSET 0) AS r
            WHERE (t.pkey, t.k, t.v, t.seq) >= (p_pkey, p_k, p_v, p_first) AND (t.pkey, t.k, t.v, t.seq) <= (p_pkey, p_k, p_v, p_last)
                AND t.name >= p_lo AND t.name < p_hi AND (p_slashes IS NULL OR length(t.name) - length(replace(t.name, '/', '')) = p_slashes)
            ORDER BY t.pkey DESC, t.k DESC, t.v DESC, t.seq DESC LIMIT p_limit;
    ELSIF p_by_seq THEN
        RETURN QUERY SELECT r.* FROM @schema.tags AS t CROSS JOIN LATERAL (
                SELECT r.name, r.seq, r.etag, r.digest, r.tags, CASE WHEN p_values THEN r.value ELSE ''::bytea END
                FROM @schema.records AS r WHERE r.pkey = t.pkey AND r.name = t.name OFFSET 0) AS r
            WHERE (t.pkey, t.k, t.v, t.seq) >= (p_pkey, p_k, p_v, p_first) AND (t.pkey, t.k, t.v, t.seq) <= (p_pkey, p_k, p_v, p_last)
                AND t.name >= p_lo AND t.name < p_hi AND (p_slashes IS NULL OR length(t.name) - length(replace(t.name, '/', '')) = p_slashes)
            ORDER BY t.pkey, t.k, t.v, t.seq LIMIT p_limit;
    ELSIF p_desc THEN
        RETURN QUERY SELECT r.* FROM @schema.tags AS t CROSS JOIN LATERAL (
                SELECT r.name, r.seq, r.etag, r.digest, r.tags, CASE WHEN p_values THEN r.value ELSE ''::bytea END
                FROM @schema.records AS r WHERE r.pkey = t.pkey AND r.name = t.name OFFSET 0) AS r
            WHERE (t.pkey, t.k, t.v, t.name) >= (p_pkey, p_k, p_v, p_lo) AND (t.pkey, t.k, t.v, t.name) < (p_pkey, p_k, p_v, p_hi)
                AND (p_slashes IS NULL OR length(t.name) - length(replace(t.name, '/', '')) = p_slashes)
            ORDER BY t.pkey DESC, t.k DESC, t.v DESC, t.name DESC LIMIT p_limit;
    ELSE
        RETURN QUERY SELECT r.* FROM @schema.tags AS t CROSS JOIN LATERAL (
                SELECT r.name, r.seq, r.etag, r.digest, r.tags, CASE WHEN p_values THEN r.value ELSE ''::bytea END
                FROM @schema.records AS r WHERE r.pkey = t.pkey AND r.name = t.name OFFSET 0) AS r
            WHERE (t.pkey, t.k, t.v, t.name) >= (p_pkey, p_k, p_v, p_lo) AND (t.pkey, t.k, t.v, t.name) < (p_pkey, p_k, p_v, p_hi)
                AND (p_slashes IS NULL OR length(t.name) - length(replace(t.name, '/', '')) = p_slashes)
            ORDER BY t.pkey, t.k, t.v, t.name LIMIT p_limit;
    END IF;
END
$fn$
;;
-- migration 7: write_batch, same arguments, results and statements (CREATE
-- OR REPLACE: a running previous release keeps working), less work per call
-- on the server; records.value compressed with LZ4.
-- * PL/pgSQL builds the executor state of each of its expressions once per
--   transaction, and every batch is a transaction: nine array_fill
--   initialisations, one array per stored column of a kept put and one
--   assignment per column were each built again on every call. A put's
--   state is now one int per put (w: 0 inserted by its check, 1 to write,
--   2 to write over a record that had tags, 3 kept), its seq (sq) and, for a
--   kept put, the row its check read under the lock (kr, one composite).
-- * The checks' conditions are one CASE per put; the kept rows' columns are
--   read from that row when the results are returned (RETURN NEXT: no query
--   per row; a single final RETURN QUERY was measured and is planned again
--   on every call, far slower).
-- * records.value is compressed with LZ4 instead of pglz (the default): a
--   checkpoint of a few KB is compressed on every put, and pglz was about a
--   quarter of a put's server instructions. Existing values stay as they are
--   (both read back the same); a server built without LZ4 keeps pglz.
--   Catalog only, no rewrite; it takes the table's lock for a moment.
CREATE OR REPLACE FUNCTION @schema.write_batch(
    p_pkey text, p_user_key text, p_name bytea, p_now double precision, p_deadline double precision,
    n text[], m text[], im text[], et text[], dg text[], cd text[], tg text[], vl bytea[], tc int[],
    tk text[], tv text[], dn text[], di text[]
) RETURNS TABLE (st int, i int, name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    np int := coalesce(cardinality(n), 0);
    w int[] := '{}';
    sq bigint[] := '{}';
    kr @schema.records[] := '{}';
    cur @schema.records;
    bad int := 0;
    off int := 0;
    s bigint;
    cur_exp double precision;
    row_locks timestamptz;
    held boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('@schema.' || p_pkey, 0));
    LOOP
        SELECT p.expires_at, (SELECT u.until FROM @schema.row_lock_until AS u) INTO cur_exp, row_locks
            FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        held := FOUND;
        IF held AND (cur_exp IS NOT NULL OR clock_timestamp() < row_locks) THEN  -- its row is locked too (migration 5)
            SELECT p.expires_at INTO cur_exp FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;
            held := FOUND;  -- a sweep that held the row first deleted it: a new partition
        END IF;
        EXIT WHEN held OR np = 0;
        INSERT INTO @schema.partitions AS p (pkey, user_key, name, expires_at)
            VALUES (p_pkey, p_user_key, p_name, p_deadline)
            ON CONFLICT (pkey) DO NOTHING;
    END LOOP;
    IF cur_exp <= p_now THEN  -- expired, not yet swept: old data never comes back
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey;
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF m[x] IN ('a', 'c') THEN  -- inserted now (seq included) unless a record is there
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], nextval('@schema.seq'), et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO NOTHING
                RETURNING r.seq INTO s;
            IF FOUND THEN
                w[x] := 0; sq[x] := s;
                CONTINUE;
            END IF;
        END IF;
        SELECT * INTO cur FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        IF (CASE m[x] WHEN 'c' THEN FOUND
                      WHEN 'i' THEN NOT FOUND OR cur.etag IS DISTINCT FROM im[x]
                      WHEN 'a' THEN split_part(cur.digest, '.', 1) <> cd[x]  -- a row is there (the insert met it)
                      ELSE false END) THEN
            bad := x;
            EXIT;
        END IF;
        IF FOUND AND (m[x] = 'a' OR (m[x] = 'i' AND et[x] = im[x] AND cur.digest = dg[x])) THEN
            w[x] := 3; kr[x] := cur;  -- kept: its row as read under the lock is what the batch returns for it
        ELSE  -- its seq drawn in put order, as the inserts' own
            w[x] := CASE WHEN FOUND AND cur.tags <> '{}' THEN 2 ELSE 1 END; sq[x] := nextval('@schema.seq');
        END IF;
    END LOOP;
    IF bad = 0 AND cardinality(dn) > 0 THEN
        FOR x IN 1..cardinality(dn) LOOP
            CONTINUE WHEN di[x] IS NULL;
            SELECT r.etag INTO cur.etag FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = dn[x];
            IF NOT FOUND OR cur.etag IS DISTINCT FROM di[x] THEN
                bad := np + x;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF bad > 0 THEN  -- refused: what the checks inserted goes, then the conflict row
        DELETE FROM @schema.records AS r USING unnest(n, w) AS u (nm, w)
            WHERE u.w = 0 AND r.pkey = p_pkey AND r.name = u.nm;
        RETURN QUERY SELECT 1, bad - 1, q.nm, r.seq, r.etag, r.digest, r.tags, r.value
            FROM (SELECT CASE WHEN bad <= np THEN n[bad] ELSE dn[bad - np] END AS nm) AS q
            LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = q.nm;
        RETURN;
    END IF;
    -- the batch passed its checks: it sets the expiry (a refused one changes nothing)
    IF held AND cur_exp IS DISTINCT FROM p_deadline THEN
        UPDATE @schema.partitions AS p SET expires_at = p_deadline WHERE p.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF w[x] IN (1, 2) THEN  -- not inserted by its check: written now
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], sq[x], et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO UPDATE SET seq = EXCLUDED.seq, etag = EXCLUDED.etag,
                    digest = EXCLUDED.digest, tags = EXCLUDED.tags, value = EXCLUDED.value;
            IF w[x] = 2 THEN
                DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = n[x];
            END IF;
        END IF;
        IF tc[x] > 0 AND w[x] < 3 THEN
            INSERT INTO @schema.tags (pkey, name, k, v, seq)
                SELECT p_pkey, n[x], tk[j], tv[j], sq[x] FROM generate_series(off + 1, off + tc[x]) AS j;
        END IF;
        off := off + tc[x];
        IF w[x] = 3 THEN
            cur := kr[x];
            st := 2; i := x - 1; name := cur.name; seq := cur.seq; etag := cur.etag; digest := cur.digest;
            tags := cur.tags; value := cur.value;
        ELSE
            st := 0; i := x - 1; name := NULL; seq := sq[x]; etag := NULL; digest := NULL; tags := NULL;
            value := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF cardinality(dn) > 0 THEN
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.name = ANY (dn);
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (dn);
        IF NOT EXISTS (SELECT 1 FROM @schema.records AS r WHERE r.pkey = p_pkey) THEN
            DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        END IF;
    END IF;
END
$fn$
;;
DO $do$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE @schema.records ALTER COLUMN value SET COMPRESSION lz4;
    END IF;
END
$do$

;;
-- migration 8: the tags table loses its (pkey, name, k) index. Its primary
-- key is now (pkey, k, v, name), the index name-order tag reads walk (before,
-- tags_kv_name, without uniqueness): a tag row costs two index entries where
-- it cost three (a put of a checkpoint with two tags: two fewer index
-- inserts, about 290 bytes at rest fewer). The (pkey, name) lookups that
-- index served were write_batch's deletion of a replaced or deleted record's
-- tag rows; they now delete each tag row by its full key (one DELETE per tag
-- row: with all four columns of the unique key given, no plan can walk the
-- partition's tags, where a join on tag_pairs or = ANY on k and v let the
-- planner keep only (pkey, name) as the index condition), read from the
-- record's own tags column (tags_json: canonical, ASCII, keys sorted, every
-- key and value the same JSON string the tag row holds; tag_pairs cuts them
-- out of it without decoding). Reads of a partition's tags (drop, sweep,
-- expiry) go by pkey, the leading column of both indexes. write_batch:
-- CREATE OR REPLACE, same arguments, results and checks, so a process of an
-- earlier release runs it too. Building the unique index reads the tags
-- table once and blocks writes to it meanwhile.
CREATE FUNCTION @schema.tag_pairs(p_tags text) RETURNS TABLE (k text, v text)
LANGUAGE sql IMMUTABLE STRICT ROWS 2 AS $fn$
    SELECT g[1], g[2] FROM regexp_matches(p_tags, '("(?:[^"\\]|\\.)*"):("(?:[^"\\]|\\.)*")', 'g') AS g
$fn$
;;
CREATE UNIQUE INDEX tags_key ON @schema.tags (pkey, k, v, name)
;;
ALTER TABLE @schema.tags DROP CONSTRAINT tags_pkey
;;
DROP INDEX @schema.tags_kv_name
;;
ALTER TABLE @schema.tags ADD CONSTRAINT tags_pkey PRIMARY KEY USING INDEX tags_key
;;
CREATE OR REPLACE FUNCTION @schema.write_batch(
    p_pkey text, p_user_key text, p_name bytea, p_now double precision, p_deadline double precision,
    n text[], m text[], im text[], et text[], dg text[], cd text[], tg text[], vl bytea[], tc int[],
    tk text[], tv text[], dn text[], di text[]
) RETURNS TABLE (st int, i int, name text, seq bigint, etag text, digest text, tags text, value bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    np int := coalesce(cardinality(n), 0);
    w int[] := '{}';
    sq bigint[] := '{}';
    kr @schema.records[] := '{}';
    cur @schema.records;
    bad int := 0;
    off int := 0;
    s bigint;
    cur_exp double precision;
    row_locks timestamptz;
    held boolean;
    tgk text;
    tgv text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('@schema.' || p_pkey, 0));
    LOOP
        SELECT p.expires_at, (SELECT u.until FROM @schema.row_lock_until AS u) INTO cur_exp, row_locks
            FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        held := FOUND;
        IF held AND (cur_exp IS NOT NULL OR clock_timestamp() < row_locks) THEN  -- its row is locked too (migration 5)
            SELECT p.expires_at INTO cur_exp FROM @schema.partitions AS p WHERE p.pkey = p_pkey FOR UPDATE;
            held := FOUND;  -- a sweep that held the row first deleted it: a new partition
        END IF;
        EXIT WHEN held OR np = 0;
        INSERT INTO @schema.partitions AS p (pkey, user_key, name, expires_at)
            VALUES (p_pkey, p_user_key, p_name, p_deadline)
            ON CONFLICT (pkey) DO NOTHING;
    END LOOP;
    IF cur_exp <= p_now THEN  -- expired, not yet swept: old data never comes back
        DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey;
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF m[x] IN ('a', 'c') THEN  -- inserted now (seq included) unless a record is there
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], nextval('@schema.seq'), et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO NOTHING
                RETURNING r.seq INTO s;
            IF FOUND THEN
                w[x] := 0; sq[x] := s;
                CONTINUE;
            END IF;
        END IF;
        SELECT * INTO cur FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = n[x];
        IF (CASE m[x] WHEN 'c' THEN FOUND
                      WHEN 'i' THEN NOT FOUND OR cur.etag IS DISTINCT FROM im[x]
                      WHEN 'a' THEN split_part(cur.digest, '.', 1) <> cd[x]  -- a row is there (the insert met it)
                      ELSE false END) THEN
            bad := x;
            EXIT;
        END IF;
        IF FOUND AND (m[x] = 'a' OR (m[x] = 'i' AND et[x] = im[x] AND cur.digest = dg[x])) THEN
            w[x] := 3; kr[x] := cur;  -- kept: its row as read under the lock is what the batch returns for it
        ELSE  -- its seq drawn in put order, as the inserts' own
            w[x] := CASE WHEN FOUND AND cur.tags <> '{}' THEN 2 ELSE 1 END; sq[x] := nextval('@schema.seq');
            IF w[x] = 2 THEN
                kr[x] := cur;  -- its tags name the tag rows to delete
            END IF;
        END IF;
    END LOOP;
    IF bad = 0 AND cardinality(dn) > 0 THEN
        FOR x IN 1..cardinality(dn) LOOP
            CONTINUE WHEN di[x] IS NULL;
            SELECT r.etag INTO cur.etag FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = dn[x];
            IF NOT FOUND OR cur.etag IS DISTINCT FROM di[x] THEN
                bad := np + x;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF bad > 0 THEN  -- refused: what the checks inserted goes, then the conflict row
        DELETE FROM @schema.records AS r USING unnest(n, w) AS u (nm, w)
            WHERE u.w = 0 AND r.pkey = p_pkey AND r.name = u.nm;
        RETURN QUERY SELECT 1, bad - 1, q.nm, r.seq, r.etag, r.digest, r.tags, r.value
            FROM (SELECT CASE WHEN bad <= np THEN n[bad] ELSE dn[bad - np] END AS nm) AS q
            LEFT JOIN @schema.records AS r ON r.pkey = p_pkey AND r.name = q.nm;
        RETURN;
    END IF;
    -- the batch passed its checks: it sets the expiry (a refused one changes nothing)
    IF held AND cur_exp IS DISTINCT FROM p_deadline THEN
        UPDATE @schema.partitions AS p SET expires_at = p_deadline WHERE p.pkey = p_pkey;
    END IF;
    FOR x IN 1..np LOOP
        IF w[x] IN (1, 2) THEN  -- not inserted by its check: written now
            INSERT INTO @schema.records AS r (pkey, name, seq, etag, digest, tags, value)
                VALUES (p_pkey, n[x], sq[x], et[x], dg[x], tg[x], vl[x])
                ON CONFLICT ON CONSTRAINT records_pkey DO UPDATE SET seq = EXCLUDED.seq, etag = EXCLUDED.etag,
                    digest = EXCLUDED.digest, tags = EXCLUDED.tags, value = EXCLUDED.value;
            IF w[x] = 2 THEN  -- the replaced record's tag rows, each by its full key
                FOR tgk, tgv IN SELECT g.k, g.v FROM @schema.tag_pairs(kr[x].tags) AS g LOOP
                    DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.k = tgk AND t.v = tgv AND t.name = n[x];
                END LOOP;
            END IF;
        END IF;
        IF tc[x] > 0 AND w[x] < 3 THEN
            INSERT INTO @schema.tags (pkey, name, k, v, seq)
                SELECT p_pkey, n[x], tk[j], tv[j], sq[x] FROM generate_series(off + 1, off + tc[x]) AS j;
        END IF;
        off := off + tc[x];
        IF w[x] = 3 THEN
            cur := kr[x];
            st := 2; i := x - 1; name := cur.name; seq := cur.seq; etag := cur.etag; digest := cur.digest;
            tags := cur.tags; value := cur.value;
        ELSE
            st := 0; i := x - 1; name := NULL; seq := sq[x]; etag := NULL; digest := NULL; tags := NULL;
            value := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
    IF cardinality(dn) > 0 THEN
        FOR cur IN SELECT * FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (dn) AND r.tags <> '{}' LOOP
            FOR tgk, tgv IN SELECT g.k, g.v FROM @schema.tag_pairs(cur.tags) AS g LOOP
                DELETE FROM @schema.tags AS t WHERE t.pkey = p_pkey AND t.k = tgk AND t.v = tgv AND t.name = cur.name;
            END LOOP;
        END LOOP;
        DELETE FROM @schema.records AS r WHERE r.pkey = p_pkey AND r.name = ANY (dn);
        IF NOT EXISTS (SELECT 1 FROM @schema.records AS r WHERE r.pkey = p_pkey) THEN
            DELETE FROM @schema.partitions AS p WHERE p.pkey = p_pkey;
        END IF;
    END IF;
END
$fn$
