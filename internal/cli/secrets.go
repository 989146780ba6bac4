package cli

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// secretFlagInstead says what to use instead of flag name when that flag
// would carry a long-lived secret (an API key, the cluster token, a store's
// secret key): the command line of a process is readable by every user of
// its host (ps, /proc/PID/cmdline) and lands in shell histories. Such
// flags are kept, hidden, only to refuse them with that advice.
func secretFlagInstead(name string) (string, bool) {
	switch name {
	case "key":
		return "--key-file FILE or $AENV_API_KEY", true
	case "cluster-token":
		return "--cluster-token-file FILE or $AENV_CLUSTER_TOKEN", true
	case "store-secret-key":
		return "--store-secret-key-file FILE or $AWS_SECRET_ACCESS_KEY", true
	}
	return "", false
}

// refuseSecretFlags fails when cmd was given a flag that carries a
// long-lived secret.
func refuseSecretFlags(cmd *cobra.Command) error {
	var err error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if instead, ok := secretFlagInstead(f.Name); ok && err == nil {
			err = &usageError{cmd: cmd, err: fmt.Errorf("--%s would put a secret on the command line, where every user of this host can read it (ps): use %s", f.Name, instead)}
		}
	})
	return err
}

// secretFlag declares a refused secret flag on f (see secretFlagInstead).
func secretFlag(f *pflag.FlagSet, name string) {
	instead, _ := secretFlagInstead(name)
	f.String(name, "", "refused (a secret on the command line): use "+instead)
	f.MarkHidden(name)
}
