-- Demo schema and the least-privilege role tidemark connects as
-- (docs/operating.md, "PostgreSQL role").
CREATE TABLE public.orders (
    id          bigint PRIMARY KEY,
    customer    text NOT NULL,
    amount      numeric(12, 2) NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    deleted_at  timestamptz
);
-- The walk reads ORDER BY updated_at, id: this index makes every page an
-- index range scan.
CREATE INDEX orders_updated_at_id ON public.orders (updated_at, id);

-- updated_at must change on every write.
CREATE FUNCTION public.touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END $$;
CREATE TRIGGER orders_touch BEFORE UPDATE ON public.orders
    FOR EACH ROW EXECUTE FUNCTION public.touch_updated_at();

INSERT INTO public.orders (id, customer, amount)
SELECT g, 'customer-' || (g % 100), (g % 1000) + 0.99 FROM generate_series(1, 10000) g;

-- The connector's role: it can log in, read this one table and nothing
-- else. The password is a demo value (compose passes the same value to
-- tidemark in TIDEMARK_PG_PASSWORD).
CREATE ROLE tidemark LOGIN PASSWORD 'tidemark-demo-password';
GRANT CONNECT ON DATABASE shop TO tidemark;
GRANT USAGE ON SCHEMA public TO tidemark;
GRANT SELECT ON public.orders TO tidemark;
-- Horizon mode (source.horizon: true) also needs to see other sessions'
-- transactions in pg_stat_activity:
-- GRANT pg_read_all_stats TO tidemark;
