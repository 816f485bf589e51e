set terminal png size 1200,480
set output 'consistency.png'
set multiplot layout 1,2
set xlabel 'training time (s)'
set ylabel 'test accuracy (2000 samples)'
set yrange [0.7:0.9]
set key bottom right
set grid
set arrow from graph 0, first 0.85 to graph 1, first 0.85 nohead dt 2
set title 'no straggler: mlp, 2 servers, 4 workers'
plot 'curve-none-bsp.dat' using 1:2 with linespoints title 'bsp', 'curve-none-ssp1.dat' using 1:2 with linespoints title 'ssp1', 'curve-none-ssp3.dat' using 1:2 with linespoints title 'ssp3', 'curve-none-ssp8.dat' using 1:2 with linespoints title 'ssp8', 'curve-none-asp.dat' using 1:2 with linespoints title 'asp'
set title 'worker 3 8 x slower (wait): mlp, 2 servers, 4 workers'
plot 'curve-x8-bsp.dat' using 1:2 with linespoints title 'bsp', 'curve-x8-ssp1.dat' using 1:2 with linespoints title 'ssp1', 'curve-x8-ssp3.dat' using 1:2 with linespoints title 'ssp3', 'curve-x8-ssp8.dat' using 1:2 with linespoints title 'ssp8', 'curve-x8-asp.dat' using 1:2 with linespoints title 'asp'
unset multiplot
