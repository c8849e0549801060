package failpoint

import (
	"os"
	"os/exec"
	"testing"
)

func TestHitCrashesOnTheConfiguredHit(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		for range 3 {
			Hit(AfterFetch)
		}
		os.Exit(0)
	}
	for spec, want := range map[string]int{"after-fetch=2": ExitCode, "after-fetch=4": 0, "": 0, "other=1": 0} {
		cmd := exec.Command(os.Args[0], "-test.run=TestHitCrashesOnTheConfiguredHit")
		cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "TIDEMARK_FAILPOINTS="+spec)
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != want {
			t.Errorf("%q: exit %d, want %d", spec, code, want)
		}
	}
}
