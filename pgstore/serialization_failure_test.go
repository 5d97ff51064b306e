package pgstore

import (
	"testing"
)

// plantSerializationFailure makes every insert of a task with the key
// fail with a serialization failure (40001), as a conflict that recurs
// on every try would: a trigger raises it.
func plantSerializationFailure(t testing.TB, s *Store, key string) {
	t.Helper()
	ctx := hangBound(t)
	if _, err := s.pool.Exec(ctx, `CREATE FUNCTION public.fail_serialization() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.idempotency_key = TG_ARGV[0] THEN
				RAISE EXCEPTION 'planted serialization failure' USING ERRCODE = 'serialization_failure';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_serialization BEFORE INSERT ON idemgate_tasks
			FOR EACH ROW EXECUTE FUNCTION public.fail_serialization('`+key+`')`); err != nil {
		t.Fatal(err)
	}
}

// A Submit whose statement fails with a serialization failure on every
// try gives up after submitTries and returns that failure (SQLSTATE
// 40001, so a caller's retry logic knows it), never loops for ever.
func TestSubmitReturnsASerializationFailureThatRecursOnEveryTry(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	plantSerializationFailure(t, s, "always-40001")
	_, err := s.Submit(hangBound(t), tenantTask("a", "always-40001"))
	if sqlState(err) != codeSerializationFailure {
		t.Fatalf("Submit: %v; want the serialization failure (40001)", err)
	}
}

// SubmitMany whose statement fails with a serialization failure on every
// try returns that failure (SQLSTATE 40001), as Submit does; it said, of
// every item, that its key "is held, but no task with the full key …
// became visible", a different story that no retry of the caller's would
// read as transient.
func TestSubmitManyReturnsASerializationFailureThatRecursOnEveryTry(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	plantSerializationFailure(t, s, "always-40001")
	res, err := s.SubmitMany(hangBound(t), []NewTask{tenantTask("a", "fine"), tenantTask("a", "always-40001")})
	if err == nil {
		var errs []error
		for _, r := range res {
			errs = append(errs, r.Err)
		}
		t.Fatalf("SubmitMany: nil error, items' errors %v; want the serialization failure (40001)", errs)
	}
	if sqlState(err) != codeSerializationFailure {
		t.Fatalf("SubmitMany: %v; want the serialization failure (40001)", err)
	}
}
