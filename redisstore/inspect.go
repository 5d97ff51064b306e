package redisstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate"
)

var _ idemgate.Inspector = (*Store)(nil)

// inspectScript reads a record and the time left on it in one step, so
// that the two belong together.
var inspectScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return false end
return {v, redis.call('PTTL', KEYS[1])}
`)

// Inspect implements Inspector.
func (s *Store) Inspect(ctx context.Context, key string) (idemgate.RecordInfo, error) {
	k, _ := storeKey(key, "", "")
	vals, err := inspectScript.Run(ctx, s.client, []string{k}).Slice()
	switch {
	case errors.Is(err, redis.Nil):
		return idemgate.RecordInfo{}, idemgate.ErrNoRecord
	case err != nil:
		return idemgate.RecordInfo{}, fmt.Errorf("redisstore: inspect: %w", err)
	case len(vals) != 2:
		return idemgate.RecordInfo{}, fmt.Errorf("redisstore: inspect: %d values, want 2", len(vals))
	}
	v, _ := vals[0].(string)
	ms, _ := vals[1].(int64)
	r, err := parseRecord(v)
	if err != nil {
		return idemgate.RecordInfo{}, fmt.Errorf("redisstore: inspect: %w", err)
	}
	info := idemgate.RecordInfo{Finished: r.finished, Fingerprint: r.fp, Owner: r.owner, Kind: r.kind,
		Fields: len(r.sums) / storedSum, Size: len(v)}
	copy(info.Token[:], r.token)
	info.ClaimedAt, info.Lease, _ = info.Token.ClaimTimes()
	if r.rawFP {
		info.Fingerprint = "v1:" + hex.EncodeToString([]byte(r.fp))
	}
	if ms > 0 {
		info.Left = time.Duration(ms) * time.Millisecond
	}
	if r.finished {
		resp, err := decodeResponse(r.resp)
		if err != nil {
			return idemgate.RecordInfo{}, fmt.Errorf("redisstore: inspect: %w", err)
		}
		info.Status, info.Header, info.BodySize = resp.Status, resp.Header, len(resp.Body)
	}
	return info, nil
}

// Forget implements Inspector: Release's compare-and-delete, on a
// finished record's head ('F') when finished.
func (s *Store) Forget(ctx context.Context, key string, token idemgate.Token, finished bool) error {
	k, _ := storeKey(key, "", "")
	arg := getArg()
	defer putArg(arg)
	state := byte('C')
	if finished {
		state = 'F'
	}
	arg.b = append(arg.b, recordV2, state)
	arg.b = append(arg.b, token[:]...)
	n, err := releaseScript.Run(ctx, s.client, []string{k}, arg).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: forget: %w", err)
	}
	if n != 1 {
		return idemgate.ErrNoRecord
	}
	return nil
}
